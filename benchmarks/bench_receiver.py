"""The OTLP/HTTP receiver (``manage.py otlp_http``) on each of its servers, side by side
in one sitting: Granian and uvicorn serving the ASGI app (``dashboard.ingest.receiver_app``),
the same group commit behind each. (At 6b2b1b6 it also ran the hand-built server this
replaced, ``--server builtin``: the figures in deploy/SCALING.md.)

    .venv/bin/python -m benchmarks.bench_receiver --db sqlite --rounds 2 [--bad-input]

One database (a fresh SQLite data dir, or a private PostgreSQL) and one key for all;
each round starts each server in turn (the order rotates every round, so A B then
B A: a drift of the shared machine falls on each), with ``--processes`` processes,
and measures, once it is idle (the derivations of the run before done):

- 10-span protobuf batches from ``--clients`` keep-alive senders (one thread of
  non-blocking sockets, ``benchmarks.http_load``): requests/s, the server's CPU a
  request (all its processes), p95 of a request's time to its answer;
- 1,000-span batches from ``--big-clients`` senders: spans/s;
- the server's memory at the end (PSS and RSS summed over its processes);
- the load average (1 minute) at each figure: the machine is shared.

A rate is requests answered 200 over the time to the last answer (the answers come
after the commit; the rows are counted at the end as a check). ``--bad-input`` runs
the hostile-client checks against each server (tight limits: 64 KiB bodies, a 3 s
body deadline and idle timeout) and prints what each did.
"""

from __future__ import annotations

import argparse
import gzip
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, Iterator

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from benchmarks.bench_ingest import (
    ROOT,
    _serving,
    cpu_seconds,
    create_project_and_key,
    free_port,
    manage,
    private_postgres,
    process_tree,
    settle,
    span_batches,
)
from benchmarks.http_load import post_all
from benchmarks.load import django_env

PROTOBUF = "application/x-protobuf"
SERVERS = ("granian", "uvicorn")


@contextmanager
def otlp_http(env: dict[str, str], server: str, port: int, processes: int, log: Path) -> Iterator[subprocess.Popen]:
    command = [sys.executable, "manage.py", "otlp_http", "--host", "127.0.0.1", "--port", str(port),
               "--processes", str(processes), "--server", server]
    with _serving(command, env, port, log) as process:
        yield process


def memory_kib(pids: list[int]) -> tuple[int, int]:
    """(PSS, RSS) in KiB summed over ``pids``."""
    pss = rss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1])
                elif line.startswith("Rss:"):
                    rss += int(line.split()[1])
        except OSError:
            continue
    return pss, rss


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[-1] if len(values) >= 20 else max(values, default=0.0)


def measure(port: int, pid: int, key: str, small: list[bytes], big: list[bytes], args: argparse.Namespace) -> dict[str, Any]:
    empty = ExportTraceServiceRequest().SerializeToString()
    post_all(port, "/v1/traces", PROTOBUF, key, [empty] * args.clients * 4, args.clients)  # warm up
    settle(pid)
    before = cpu_seconds(process_tree(pid))
    small_out = post_all(port, "/v1/traces", PROTOBUF, key, small, args.clients)
    small_cpu = cpu_seconds(process_tree(pid)) - before
    small_load = os.getloadavg()[0]
    settle(pid)
    big_out = post_all(port, "/v1/traces", PROTOBUF, key, big, args.big_clients)
    big_load = os.getloadavg()[0]
    pss, rss = memory_kib(process_tree(pid))
    answered = len(small) - small_out.failures
    return {
        "rps": answered / small_out.seconds, "cpu_ms": small_cpu / answered * 1000,
        "p95_ms": p95(small_out.latencies) * 1000, "small_retries": small_out.retries,
        "small_failures": small_out.failures, "small_load": small_load,
        "spans_s": (len(big) - big_out.failures) * args.big_spans / big_out.seconds,
        "big_retries": big_out.retries, "big_failures": big_out.failures, "big_load": big_load,
        "pss_mb": pss / 1024, "rss_mb": rss / 1024, "processes": len(process_tree(pid)),
    }


def count_spans(env: dict[str, str]) -> int:
    code = "from dashboard.observatory.models import Span\nprint(Span.objects.count())\n"
    return int(manage(env, "shell", "-c", code).strip().splitlines()[-1])


# --- bad input ------------------------------------------------------------------------


def _read_all(sock: socket.socket, timeout: float) -> tuple[bytes, str]:
    """What came back until the server closed ("closed"), reset ("reset") or ``timeout`` ("open")."""
    sock.settimeout(timeout)
    got = b""
    try:
        while chunk := sock.recv(65536):
            got += chunk
        return got, "closed"
    except socket.timeout:
        return got, "open"
    except ConnectionResetError:
        return got, "reset"


def _status(data: bytes) -> str:
    return data.split(b"\r\n", 1)[0].split(b" ")[1].decode() if data.startswith(b"HTTP/") else "none"


def _head(key: str, *, length: int | None = None, chunked: bool = False, extra: str = "") -> bytes:
    framing = "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {length}\r\n"
    return (f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: {PROTOBUF}\r\nAuthorization: Bearer {key}\r\n"
            f"{extra}{framing}\r\n").encode()


def bad_input(port: int, key: str, limit: int, deadline: float) -> list[tuple[str, str, str]]:
    """(check, what was expected, what happened) for each hostile client."""
    good = span_batches(1, genai_every=0, size=10)[0]
    results = []

    def check(name: str, expected: str, run) -> None:
        try:
            got = run()
        except Exception as exc:  # noqa: BLE001 - a check that breaks is a finding
            got = f"error {type(exc).__name__}: {exc}"
        results.append((name, expected, got))

    def one(data: bytes, timeout: float = 15) -> str:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.sendall(data)
            got, end = _read_all(sock, timeout)
        return f"{_status(got)}, {end}"

    def fresh() -> bytes:
        return span_batches(1, genai_every=0, size=10)[0]

    def slow() -> str:
        body = fresh()
        with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
            sock.sendall(_head(key, length=len(body), extra="Connection: close\r\n"))
            for index in range(10):
                time.sleep(deadline / 20)
                sock.sendall(body[index * len(body) // 10:(index + 1) * len(body) // 10])
            got, end = _read_all(sock, 15)
        return f"{_status(got)}, {end}"

    def chunked() -> str:
        body = fresh()
        chunks = b"".join(b"%x\r\n" % len(part) + part + b"\r\n" for part in (body[:100], body[100:]))
        return one(_head(key, chunked=True, extra="Connection: close\r\n") + chunks + b"0\r\n\r\n")

    def oversize_chunked() -> str:
        with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
            sock.sendall(_head(key, chunked=True))
            piece = b"x" * 16384
            sent = 0
            try:
                while sent < limit * 4:
                    sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
                    sent += len(piece)
            except OSError:
                pass
            got, end = _read_all(sock, 10)
        return f"{_status(got)}, {end}, {sent // 1024} KiB sent"

    def oversize_sent_whole() -> str:
        body = b"x" * (limit * 2)
        return one(_head(key, length=len(body)) + body)

    def stalled() -> str:
        body = fresh()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            sock.sendall(_head(key, length=len(body)) + body[:-10])
            started = time.monotonic()
            other = one(_head(key, length=len(good), extra="Connection: close\r\n") + good)
            got, end = _read_all(sock, deadline * 4)
            return f"{_status(got)} after {time.monotonic() - started:.1f} s, {end}; another meanwhile: {other}"

    def stalled_headers() -> str:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
            started = time.monotonic()
            got, end = _read_all(sock, 40)
            return f"{_status(got)}, {end} after {time.monotonic() - started:.1f} s"

    def idle() -> str:
        with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
            sock.sendall(_head(key, length=len(good)) + good)
            sock.settimeout(10)
            first = sock.recv(65536)
            started = time.monotonic()
            _, end = _read_all(sock, 40)
            return f"{_status(first)}, then {end} after {time.monotonic() - started:.1f} s idle"

    def flood() -> str:
        held = []
        try:
            for _ in range(2000):
                held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        except OSError as exc:
            opened = f"{len(held)} opened ({exc})"
        else:
            opened = f"{len(held)} opened"
        try:
            started = time.monotonic()
            served = one(_head(key, length=len(good), extra="Connection: close\r\n") + good, timeout=20)
            return f"{opened}; a sender then: {served} in {time.monotonic() - started:.2f} s"
        finally:
            for sock in held:
                sock.close()

    def after_flood() -> str:
        time.sleep(1)
        return one(_head(key, length=len(good), extra="Connection: close\r\n") + fresh())

    def pipelined() -> str:
        a, b = fresh(), fresh()
        with socket.create_connection(("127.0.0.1", port), timeout=15) as sock:
            sock.sendall(_head(key, length=len(a)) + a + _head(key, length=len(b), extra="Connection: close\r\n") + b)
            got, end = _read_all(sock, 15)
        return f"{got.count(b'HTTP/1.1 200')} answers 200, {end}"

    check("slow body (10 pieces over half the deadline)", "200", slow)
    check("chunked body", "200", chunked)
    check("declared length over the limit", "413, closed", lambda: one(_head(key, length=limit * 10)))
    check("body over the limit sent whole", "413, closed (not reset)", oversize_sent_whole)
    check("chunked body growing past the limit", "413, closed", oversize_chunked)
    check("gzip bomb", "413", lambda: one(_head(key, length=len(bomb := gzip.compress(b"\0" * limit * 64)),
                                                 extra="Content-Encoding: gzip\r\nConnection: close\r\n") + bomb))
    check("stalled sender (all but 10 bytes)", f"408 within {deadline:.0f} s, others served", stalled)
    check("stalled headers", "closed in bounded time", stalled_headers)
    check("idle keep-alive connection", "closed after the idle timeout", idle)
    check("not HTTP", "400", lambda: one(b"this is not HTTP at all\r\n\r\n"))
    check("request line 9,000 bytes", "414 or 4xx", lambda: one(b"POST /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n"))
    check("101 header fields", "431 or 4xx", lambda: one(b"POST /v1/traces HTTP/1.1\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(101)) + b"\r\n"))
    check("a 70 KB header", "431 or 4xx", lambda: one(b"POST /v1/traces HTTP/1.1\r\nX-Big: " + b"y" * 70_000 + b"\r\n\r\n"))
    check("GET", "405", lambda: one(b"GET /v1/traces HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    check("unknown path", "404", lambda: one(b"POST /v1/nothing HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"))
    check("text/plain", "415", lambda: one(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi"))
    check("wrong key", "401", lambda: one(_head("po_0123456789abcdef_" + "x" * 43, length=len(good), extra="Connection: close\r\n") + good))
    check("garbage protobuf", "400", lambda: one(_head(key, length=8, extra="Connection: close\r\n") + b"\xff" * 8))
    check("two pipelined requests", "2 answers 200", pipelined)
    check("2,000 connections held open", "503 or served", flood)
    check("a sender after the flood", "200", after_flood)
    return results


def run(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-receiver-"))
    try:
        _run(args, workdir)
    finally:
        subprocess.run(["rm", "-rf", str(workdir)], check=False)


def _run(args: argparse.Namespace, workdir: Path) -> None:
    with private_postgres(workdir) if args.db == "postgres" else nullcontext("") as database_url:
        env = {**django_env(workdir, database_url), "OBSERVATORY_DERIVE_BACKLOG_SECONDS": "0"}
        manage(env, "migrate", "--noinput")
        key = create_project_and_key(env)
        servers = args.servers.split(",")
        if args.bad_input:
            tight = {**env, "OBSERVATORY_MAX_BODY_BYTES": str(64 * 1024),
                     "OBSERVATORY_MAX_DECODED_BYTES": str(256 * 1024), "OBSERVATORY_BODY_READ_TIMEOUT": "3",
                     "OBSERVATORY_OTLP_HTTP_IDLE_TIMEOUT": "3"}
            for server in servers:
                port = free_port()
                with otlp_http(tight, server, port, args.processes, workdir / f"{server}-bad.log"):
                    print(f"\n== bad input: {server}", flush=True)
                    for name, expected, got in bad_input(port, key, 64 * 1024, 3.0):
                        print(f"  {name:<46} expected {expected:<32} got {got}", flush=True)
            if not args.rounds:
                return
        print(f"building {args.small_batches} 10-span and {args.big_batches} {args.big_spans}-span batches ...", flush=True)
        small = span_batches(args.small_batches * args.rounds * len(servers), genai_every=0, size=10)
        big = span_batches(args.big_batches * args.rounds * len(servers), genai_every=0, size=args.big_spans)
        rows = []
        run_index = 0
        for round_ in range(args.rounds):
            order = servers[round_ % len(servers):] + servers[:round_ % len(servers)]
            for server in order:
                port = free_port()
                with otlp_http(env, server, port, args.processes, workdir / f"{server}-{round_}.log") as process:
                    mine_small = small[run_index * args.small_batches:(run_index + 1) * args.small_batches]
                    mine_big = big[run_index * args.big_batches:(run_index + 1) * args.big_batches]
                    run_index += 1
                    result = measure(port, process.pid, key, mine_small, mine_big, args)
                result.update(server=server, round=round_ + 1)
                rows.append(result)
                print(f"  round {round_ + 1} {server:<8} {result['rps']:>6.0f} req/s  {result['cpu_ms']:.2f} ms CPU/req  "
                      f"p95 {result['p95_ms']:.1f} ms  (load {result['small_load']:.1f}; retries {result['small_retries']}, "
                      f"failures {result['small_failures']})  |  {result['spans_s']:>7.0f} spans/s (load {result['big_load']:.1f}; "
                      f"retries {result['big_retries']}, failures {result['big_failures']})  |  PSS {result['pss_mb']:.0f} MB, "
                      f"RSS {result['rss_mb']:.0f} MB, {result['processes']} processes", flush=True)
        sent = len(rows) * (args.small_batches * 10 + args.big_batches * args.big_spans)
        print(f"\nspans stored {count_spans(env):,} of {sent:,} sent ({args.db}, {args.processes} processes a server, "
              f"{args.clients} / {args.big_clients} senders, {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC)")
        print(f"{'server':<8} {'req/s':>14} {'CPU ms/req':>12} {'p95 ms':>12} {'spans/s':>16} {'PSS MB':>10} {'RSS MB':>10}")
        for server in servers:
            mine = [row for row in rows if row["server"] == server]

            def span(key: str, fmt: str) -> str:
                values = [row[key] for row in mine]
                return f"{format(min(values), fmt)}–{format(max(values), fmt)}"
            print(f"{server:<8} {span('rps', ',.0f'):>14} {span('cpu_ms', '.2f'):>12} {span('p95_ms', '.1f'):>12} "
                  f"{span('spans_s', ',.0f'):>16} {span('pss_mb', '.0f'):>10} {span('rss_mb', '.0f'):>10}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--servers", default=",".join(SERVERS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--big-clients", type=int, default=4)
    parser.add_argument("--small-batches", type=int, default=6000, help="10-span batches a run")
    parser.add_argument("--big-batches", type=int, default=150, help="big batches a run")
    parser.add_argument("--big-spans", type=int, default=1000)
    parser.add_argument("--bad-input", action="store_true", help="run the hostile-client checks against each server first")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    run(args)


if __name__ == "__main__":
    main()
