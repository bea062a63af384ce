"""The gthread worker with its lingering close off the event loop
(dashboard.gunicorn_worker), in a real gunicorn (deploy/gunicorn.conf.py)."""

from __future__ import annotations

import http.client
import socket
import threading
import time

from dashboard.gunicorn_worker import Linger

from .ingest.interop import running_stack


def request_and_keep_open(port: int) -> socket.socket:
    """A client that asks the server to close, reads the answer, and keeps its
    side open (as an exporter waiting out Retry-After did)."""
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    client.sendall(b"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
    answer = b""
    while b"\r\n\r\n" not in answer:
        answer += client.recv(65536)
    assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
    return client


def test_a_client_slow_to_close_holds_back_no_other_request(tmp_path_factory):
    """Before, the worker's event loop read from the closed connection until its
    client closed (up to 2 s, gunicorn 26+), and every other request of the worker waited."""
    workdir = tmp_path_factory.mktemp("linger")
    with running_stack(workdir, WEB_CONCURRENCY="1") as stack:  # one worker: both clients meet in it
        port = stack.web.port
        lingering = [request_and_keep_open(port) for _ in range(3)]
        try:
            started = time.monotonic()
            other = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            other.request("GET", "/accounts/login/")
            assert other.getresponse().status == 200
            assert time.monotonic() - started < 0.5
            other.close()
        finally:
            for client in lingering:
                client.close()


def test_it_closes_a_lingering_socket_once_its_client_closes_or_after_its_time():
    linger = Linger(seconds=0.3)
    quick_server, quick_client = socket.socketpair()
    slow_server, slow_client = socket.socketpair()
    linger.close(quick_server)
    linger.close(slow_server)
    assert quick_client.recv(1) == b""  # the half-close reached the client at once
    quick_client.close()
    deadline = time.monotonic() + 5
    while quick_server.fileno() != -1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert quick_server.fileno() == -1  # closed once its client closed
    assert slow_server.fileno() != -1  # its client still has it open
    while slow_server.fileno() != -1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slow_server.fileno() == -1  # closed after its time
    slow_client.close()


def test_it_stops_reading_a_client_that_sends_too_much():
    linger = Linger(seconds=30, max_bytes=1000)
    server, client = socket.socketpair()
    linger.close(server)
    client.sendall(b"x" * 5000)
    deadline = time.monotonic() + 5
    while server.fileno() != -1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.fileno() == -1
    client.close()


def test_it_waits_without_spinning_when_nothing_lingers():
    """Its thread sleeps in its selector between sockets (a first version spun there,
    taking a quarter of a core from every worker of the soak)."""
    linger = Linger(seconds=0.1)
    server, client = socket.socketpair()
    linger.close(server)
    client.close()
    time.sleep(0.3)  # the socket is closed and forgotten; nothing lingers now
    stat = f"/proc/self/task/{linger._thread.native_id}/stat"

    def cpu_ticks() -> int:
        with open(stat) as file:
            fields = file.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])  # utime + stime

    before = cpu_ticks()
    time.sleep(1.0)
    assert cpu_ticks() - before <= 2  # clock ticks (1/100 s): idle, not a busy loop


def test_a_linger_thread_that_died_is_started_again_by_the_next_close():
    """Its failure mode: the one thread gone (an error inside it), the next close starts
    another, so half-closed sockets never pile up unclosed."""
    linger = Linger(seconds=30)
    dead = threading.Thread(target=lambda: None)  # stands for a thread that ended
    dead.start()
    dead.join()
    linger._thread = dead
    server, client = socket.socketpair()
    linger.close(server)
    assert linger._thread is not dead and linger._thread.is_alive()
    assert client.recv(1) == b""  # half-closed at once
    client.close()
    deadline = time.monotonic() + 5
    while server.fileno() != -1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.fileno() == -1  # closed by the new thread once its client closed
