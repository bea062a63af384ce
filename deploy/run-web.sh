#!/usr/bin/env bash
# The web process: migrate, collect static files, serve with gunicorn.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
# WEB_MIGRATE=0 on the nodes after the first: two nodes applying a new migration at once can fail.
if [ "${WEB_MIGRATE:-1}" != 0 ]; then
  "$PY" manage.py migrate --noinput
fi
"$PY" manage.py collectstatic --noinput >/dev/null
exec "$PY" -m gunicorn --config deploy/gunicorn.conf.py dashboard.wsgi:application
