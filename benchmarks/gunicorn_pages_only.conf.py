"""deploy/gunicorn.conf.py without the embedded derivation thread in its workers: the
web server serves pages and the API only, the derivations run where ingest runs (the
OTLP/HTTP receiver's processes). For side-by-side runs only
(``bench_chaos --ingest receiver --no-web-derivations``). The app is then imported in
each worker (no preload), since the deployed hooks start the thread after the fork
exactly when it is preloaded."""

from pathlib import Path

_DEPLOYED = Path(__file__).resolve().parent.parent / "deploy" / "gunicorn.conf.py"
exec(compile(_DEPLOYED.read_text(), str(_DEPLOYED), "exec"))

preload_app = False  # noqa: F811 (post_fork starts the thread only when preloaded; wsgi.py not after the deployed config)
