#!/usr/bin/env bash
# The web process: migrate, collect static files, serve with gunicorn.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" manage.py migrate --noinput
"$PY" manage.py collectstatic --noinput >/dev/null
exec "$PY" -m gunicorn --config deploy/gunicorn.conf.py dashboard.wsgi:application
