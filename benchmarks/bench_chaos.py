"""Faults under load: 16 agents sending, the whole server killed with SIGKILL in
the middle and restarted, a logged-in reader timing pages throughout.

    .venv/bin/python -m benchmarks.bench_chaos                 # SQLite and PostgreSQL, 30 s of load each
    .venv/bin/python -m benchmarks.bench_chaos --db sqlite --seconds 60 --down 10

Per database: a fresh data dir (PostgreSQL: a private cluster, stopped at the end),
gunicorn with deploy/gunicorn.conf.py (2 workers x 4 threads, the embedded
derivations), --senders agents each alternating an OTLP batch of
--spans-per-batch spans (a quarter of them GenAI tool spans naming a
conversation) and a batch of --records-per-batch tool records, retrying each
batch like an exporter until acknowledged. At --kill-at of the load, the master
and every worker get SIGKILL together; after --down seconds the server starts
again and the agents carry on. Printed:

- acknowledged vs stored: every acknowledged span and record must be stored (a
  batch stored but not acknowledged before the kill is sent again: no duplicate);
- convergence: seconds after the load until conversation totals, hourly tool
  rollups and links agree with a recount of the rows (benchmarks.load.divergence),
  with no manual command;
- peak server RSS (master + workers) under the load; page p95 while the agents
  send (pages answered; failures during the outage counted apart).
Targets: nothing lost, converged < 60 s, RSS < 400 MB, page p95 < 500 ms.

Side by side (deploy/SCALING.md, issue 33): ``--ingest receiver --nice N`` sends the
spans to ``manage.py otlp_http`` under ``nice -n N`` (spans only: ``--records-per-batch 0``),
the web server serving the pages (as deployed: deploy/run-otlp-http.sh runs the receiver
niced); ``--no-web-derivations`` without the web workers' derivation thread;
``--worker-class gthread`` with gunicorn's stock worker; ``--lingerers N`` adds clients
slow to close on the web port; ``--no-page-yield`` without the in-process page priority.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import nullcontext
from pathlib import Path

from benchmarks.bench_ingest import PYTHON, free_port, manage, private_postgres, receiver
from benchmarks.load import (
    Acknowledged,
    Agent,
    PageReader,
    RssSampler,
    Server,
    django_env,
    load_average,
    project_key_and_session,
    setup_django,
    losses,
    wait_until_converged,
)


def run(db: str, args: argparse.Namespace) -> dict[str, object]:
    workdir = Path(tempfile.mkdtemp(prefix=f"bench-chaos-{db}-"))
    try:
        with private_postgres(workdir) if db == "postgres" else nullcontext("") as database_url:
            env = django_env(workdir, database_url)
            if args.no_page_yield:
                env["DJANGO_SETTINGS_MODULE"] = "benchmarks.no_page_yield_settings"
            manage(env, "migrate", "--noinput")
            setup_django(env)
            project, key, session = project_key_and_session()
            options = ("-k", "gthread") if args.worker_class == "gthread" else ()
            if args.no_web_derivations:
                options += ("-c", str(Path(__file__).with_name("gunicorn_pages_only.conf.py")))
            server = Server(env, options=options)
            server.start()
            try:
                if args.ingest == "web":
                    return _load_and_kill(server, project, key, session, args, db, server.port)
                port = free_port()
                with receiver(env, port, processes=None, log=workdir / "receiver.log", nice=args.nice):
                    return _load_and_kill(server, project, key, session, args, db, port)
            finally:
                server.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _load_and_kill(server: Server, project, key: str, session: str, args: argparse.Namespace, db: str,
                   ingest_port: int) -> dict[str, object]:
    acknowledged = Acknowledged()
    stop, stop_watch = threading.Event(), threading.Event()
    agents = [
        Agent(ingest_port, key, acknowledged, span_batch_sizes=(args.spans_per_batch,),
              records_per_batch=args.records_per_batch, seed=index)
        for index in range(args.senders)
    ]
    reader = PageReader(server.port, session, project.slug)
    sampler = RssSampler(server)
    threads = [threading.Thread(target=agent.run, args=(stop,)) for agent in agents]
    lingered = [0] * args.lingerers
    threads += [threading.Thread(target=_linger, args=(server.port, stop, lingered, index))
                for index in range(args.lingerers)]
    threads.append(threading.Thread(target=reader.run, args=(stop,)))
    watcher = threading.Thread(target=sampler.run, args=(stop_watch,))
    watcher.start()
    for thread in threads:
        thread.start()
    if args.no_kill:  # the load alone: page times and memory under it
        time.sleep(args.seconds)
        killed_at = restarted_at = time.monotonic()
        restart_seconds = 0.0
    else:
        time.sleep(args.seconds * args.kill_at)
        say(f"{db}: SIGKILL after {acknowledged.batches} batches")
        server.kill()
        killed_at = time.monotonic()
        time.sleep(args.down)
        restart_seconds = server.start()
        restarted_at = time.monotonic()
        time.sleep(max(0.0, args.seconds * (1 - args.kill_at) - args.down))
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    load_ended = time.monotonic()
    say(f"{db}: load over, {acknowledged.batches} batches; waiting for derived data to converge")
    converged, off = wait_until_converged(project.pk, timeout=args.converge_timeout)
    stop_watch.set()
    watcher.join()
    return {
        "db": db,
        "batches": acknowledged.batches,
        "acked_spans": len(acknowledged.span_ids),
        "acked_records": len(acknowledged.tool_call_ids),
        **losses(project.pk, span_ids=acknowledged.span_ids, tool_call_ids=acknowledged.tool_call_ids),
        "retries": acknowledged.retries,
        "connection_errors": acknowledged.connection_errors,
        "refused": acknowledged.refused,
        "first_refusal": acknowledged.first_refusal,
        "down_seconds": restarted_at - killed_at,
        "restart_seconds": restart_seconds,
        "converged_after_load_s": converged,
        "converged_after_restart_s": None if converged is None else load_ended - restarted_at + converged,
        "divergence": off,
        "peak_rss_mb": sampler.peak,
        "peak_pss_mb": sampler.peak_pss,
        "lingered": sum(lingered),
        "page_p95_ms": reader.p95_ms(),
        "page_summary": reader.summary(),
        "pages": len(reader.times),
        "page_failures": reader.failures,
        "first_page_failure": reader.first_failure,
    }


def _linger(port: int, stop: threading.Event, lingered: list[int], index: int, *, hold: float = 1.0) -> None:
    """A client slow to close, as an exporter waiting out a Retry-After on its
    connection: asks the web server to close, reads the answer, keeps its side
    open ``hold`` seconds, closes; again until ``stop``."""
    request = f"GET /accounts/login/ HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode()
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
                client.sendall(request)
                answer = b""
                while b"\r\n\r\n" not in answer and (chunk := client.recv(65536)):
                    answer += chunk
                lingered[index] += 1
                stop.wait(hold)
        except OSError:
            stop.wait(0.1)


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--senders", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=30.0, help="load duration, the outage included")
    parser.add_argument("--kill-at", type=float, default=0.4, help="fraction of the load at which to SIGKILL")
    parser.add_argument("--down", type=float, default=5.0, help="seconds the server stays down")
    parser.add_argument("--spans-per-batch", type=int, default=512)
    parser.add_argument("--records-per-batch", type=int, default=100)
    parser.add_argument("--converge-timeout", type=float, default=120.0)
    parser.add_argument("--no-kill", action="store_true", help="load only: no SIGKILL, no outage")
    parser.add_argument("--ingest", choices=["web", "receiver"], default="web",
                        help="where the agents send: the web server's /v1/traces (and /api/v1/records), or the "
                             "OTLP/HTTP receiver (manage.py otlp_http; spans only: use --records-per-batch 0)")
    parser.add_argument("--nice", type=int, default=0,
                        help="with --ingest receiver: run the receiver at this lower CPU priority (nice -n)")
    parser.add_argument("--worker-class", choices=["deployed", "gthread"], default="deployed",
                        help="the web server's worker: deploy/gunicorn.conf.py's (lingering closes on a thread) "
                             "or gunicorn's stock gthread")
    parser.add_argument("--no-web-derivations", action="store_true",
                        help="with --ingest receiver: no derivation thread in the web server's workers "
                             "(benchmarks/gunicorn_pages_only.conf.py), the derivations in the receiver")
    parser.add_argument("--lingerers", type=int, default=0,
                        help="clients slow to close on the web port (each: a request with Connection: close, "
                             "its side kept open 1 s, closed, again)")
    parser.add_argument("--no-page-yield", action="store_true",
                        help="the servers without PagePriorityMiddleware (benchmarks/no_page_yield_settings.py): "
                             "ingest never steps aside for a page of its own process")
    parser.add_argument("--json", action="store_true", help="print one JSON line (used for --db both)")
    args = parser.parse_args(argv)
    if args.ingest == "receiver" and args.records_per_batch:
        parser.error("the receiver takes OTLP only: --ingest receiver needs --records-per-batch 0")
    if args.no_web_derivations and args.ingest != "receiver":
        parser.error("--no-web-derivations needs --ingest receiver")
    if args.nice and args.ingest != "receiver":
        parser.error("--nice lowers the receiver's priority: it needs --ingest receiver")

    if args.db == "both":
        results = []
        for db in ("sqlite", "postgres"):
            # One process per database: Django is configured once per process.
            command = [PYTHON, "-m", "benchmarks.bench_chaos", *(argv or sys.argv[1:]), "--db", db, "--json"]
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.seconds + args.converge_timeout + 600)
            if done.returncode:
                raise SystemExit(f"{db} run failed:\n{done.stderr[-3000:]}")
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    else:
        results = [run(args.db, args)]
        if args.json:
            print(json.dumps(results[0]))
            return
    print(f"{args.senders} agents, {args.seconds:.0f} s of load, SIGKILL to every server process at "
          f"{args.kill_at:.0%}, {args.down:.0f} s down" if not args.no_kill else f"{args.senders} agents, {args.seconds:.0f} s of load, no kill")
    print(f"ingest to {'the web server' if args.ingest == 'web' else f'the OTLP/HTTP receiver (nice {args.nice})'}, "
          f"web worker {args.worker_class}{', no web derivations' if args.no_web_derivations else ''}"
          f"{', no page yield' if args.no_page_yield else ''}; load average {load_average()}")
    for result in results:
        converged = result["converged_after_load_s"]
        print(f"\n{result['db']}: {result['batches']} batches acknowledged, {result['retries']} answered 429/503, "
              f"{result['connection_errors']} connection errors, {result['refused']} refused {result['first_refusal']}")
        print(f"  acknowledged spans {result['acked_spans']:>9}  stored {result['stored_spans']:>9}  "
              f"lost {result['lost_spans']}  duplicates {result['duplicate_spans']}")
        print(f"  acknowledged records {result['acked_records']:>7}  stored {result['stored_records']:>9}  "
              f"lost {result['lost_records']}  duplicates {result['duplicate_records']}")
        print(f"  down {result['down_seconds']:.1f} s (restart took {result['restart_seconds']:.1f} s); derived data "
              + (f"converged {converged:.1f} s after the load ({result['converged_after_restart_s']:.1f} s after the restart)"
                 if converged is not None else f"NOT converged: {result['divergence']}"))
        print(f"  peak server RSS {result['peak_rss_mb']:.0f} MB (PSS {result['peak_pss_mb']:.0f} MB); page p95 under load {result['page_p95_ms']:.0f} ms "
              f"over {result['pages']} pages ({result['page_failures']} failed, the outage included; "
              f"first: {result['first_page_failure'] or '-'})")
        print(f"  {result['page_summary']}")
        if result["lingered"]:
            print(f"  {result['lingered']} connections closed slowly by their clients")
    print("\ntargets: lost 0, duplicates 0, converged < 60 s, peak RSS < 400 MB, page p95 < 500 ms")


if __name__ == "__main__":
    main()
