"""gunicorn's gthread worker, with a connection's lingering close off its event loop.

Since gunicorn 26 a worker closes a connection it will not keep alive "gracefully"
(RFC 9112 section 9.6): it half-closes it, then reads until the client closes its
side, for up to 2 s. For the gthread worker that happens on the thread that accepts
connections and hands them to the request threads, so one client that does not
close at once holds back every other request of the worker meanwhile. In the soak,
agents answered 429 kept their connection open while waiting out Retry-After; each
such close stopped its worker for up to 2 s, and the pages waited behind it: p95
1.0 s, of which the pages' own time was under 1 ms.

Here the lingering close is the same (half-close, read until the client closes, at
most LINGER_SECONDS and LINGER_BYTES), but one ``Linger`` thread per worker does it
for all connections, with a selector, so the event loop only hands the socket over.
"""

from __future__ import annotations

import functools
import logging
import queue
import selectors
import socket
import threading
import time

from gunicorn import util
from gunicorn.workers import gthread

logger = logging.getLogger(__name__)

LINGER_SECONDS = 2.0  # as gunicorn's own lingering close
LINGER_BYTES = 65536


class Linger:
    """Closes half-closed sockets once their clients close, or after LINGER_SECONDS,
    or after LINGER_BYTES read from them: one daemon thread, started on first use."""

    def __init__(self, *, seconds: float = LINGER_SECONDS, max_bytes: int = LINGER_BYTES) -> None:
        self.seconds = seconds
        self.max_bytes = max_bytes
        self._handed: queue.SimpleQueue[socket.socket] = queue.SimpleQueue()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)  # the event loop never waits on it
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def close(self, sock: socket.socket) -> None:
        """Half-close ``sock`` now; the rest happens on the linger thread."""
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:  # the client is gone already
            util.close(sock)
            return
        self._handed.put(sock)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="linger", daemon=True)
                self._thread.start()
        try:
            self._wake_write.send(b"\0")
        except OSError:  # the buffer is full: the thread is awake already
            pass

    def _run(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_read, selectors.EVENT_READ)
        open_: dict[socket.socket, tuple[float, int]] = {}  # socket -> (deadline, bytes read)
        while True:
            while True:
                try:
                    sock = self._handed.get_nowait()
                except queue.Empty:
                    break
                try:
                    sock.setblocking(False)
                    selector.register(sock, selectors.EVENT_READ)
                except (OSError, ValueError):
                    util.close(sock)
                    continue
                open_[sock] = (time.monotonic() + self.seconds, 0)
            # Until the first deadline; with nothing lingering, until woken.
            timeout = max(0.0, min(deadline for deadline, _ in open_.values()) - time.monotonic()) if open_ else None
            for key, _ in selector.select(timeout):
                if key.fileobj is self._wake_read:
                    try:
                        while self._wake_read.recv(4096):
                            pass
                    except OSError:
                        pass
                    continue
                sock = key.fileobj
                deadline, read = open_[sock]
                try:
                    data = sock.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data and read + len(data) < self.max_bytes:
                    open_[sock] = (deadline, read + len(data))
                    continue
                self._forget(selector, open_, sock)  # the client closed, or sent too much
            now = time.monotonic()
            for sock in [sock for sock, (deadline, _) in open_.items() if deadline <= now]:
                self._forget(selector, open_, sock)

    @staticmethod
    def _forget(selector: selectors.BaseSelector, open_: dict, sock: socket.socket) -> None:
        try:
            selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        open_.pop(sock, None)
        util.close(sock)


class ThreadWorker(gthread.ThreadWorker):
    """gthread with ``Linger``: deploy/gunicorn.conf.py names it as the worker class."""

    def init_process(self) -> None:
        self.linger = Linger()
        super().init_process()

    def enqueue_req(self, conn) -> None:
        if "close" not in vars(conn):
            conn.close = functools.partial(self._close, conn)
        super().enqueue_req(conn)

    def _close(self, conn, graceful: bool = False) -> None:
        if graceful:
            self.linger.close(conn.sock)
        else:
            util.close(conn.sock)
