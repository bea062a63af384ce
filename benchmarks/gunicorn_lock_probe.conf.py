"""deploy/gunicorn.conf.py with benchmarks/sqlite_lock_probe installed in each worker:
for ``bench_soak --lock-probe`` only."""

from pathlib import Path

_DEPLOYED = Path(__file__).resolve().parent.parent / "deploy" / "gunicorn.conf.py"
exec(compile(_DEPLOYED.read_text(), str(_DEPLOYED), "exec"))
_deployed_post_fork = post_fork  # noqa: F821 (defined by the deployed config)


def post_fork(server, worker):  # noqa: F811
    from benchmarks import sqlite_lock_probe

    sqlite_lock_probe.install()
    _deployed_post_fork(server, worker)
