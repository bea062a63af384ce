#!/usr/bin/env bash
# Sets up everything the tests need and runs the whole suite:
#   - the Python environment (.venv) with the test extras;
#   - Debian's chromium, a CJK font and redis-server (installed with apt when missing);
#   - a private PostgreSQL 15 and a private Redis on free loopback ports under a temp dir;
#   - ruff (lint), then the suite on SQLite, the dashboard suite again on PostgreSQL, the Celery
#     task tests on a real worker over Redis; every test bounded by pytest-timeout; then stops
#     what it started;
#   - the OpenTelemetry JS exporters for the interop tests: `npm ci` of tests/interop/js's
#     package-lock into .cache/interop-js (outside the product code, never committed); skipped,
#     saying so, when node/npm are absent (the JS interop tests then skip too).
# Extra arguments go to pytest (e.g. deploy/test.sh -k otlp).
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/lib.sh

ensure_venv test

missing=()
[ -x /usr/lib/chromium/chromium ] || missing+=(chromium)
command -v redis-server >/dev/null || missing+=(redis-server)
fc-list 2>/dev/null | grep -qi 'wenquanyi\|wqy' || missing+=(fonts-wqy-microhei)
if [ ${#missing[@]} -gt 0 ]; then
  echo "Installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" -ne 0 ]; then
    echo "Needs root for apt-get install ${missing[*]} (or install them by hand)." >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
work=$(mktemp -d /tmp/observatory-test.XXXXXX)
chmod 755 "$work"
pg_started=""
redis_pid=""
cleanup() {
  set +e
  [ -n "$pg_started" ] && runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$work/pg" -m fast -w stop >/dev/null
  [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

pg_port=$(free_port)
mkdir "$work/pg" && chown postgres "$work/pg"
runuser -u postgres -- "$PG_BIN/initdb" -D "$work/pg" -A trust -U postgres >/dev/null
runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$work/pg" -l "$work/pg/log" -w \
  -o "-p $pg_port -k $work/pg -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off" start >/dev/null
pg_started=1

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
  >"$work/redis.log" 2>&1 &
redis_pid=$!

export OBSERVATORY_TEST_REDIS_URL="redis://127.0.0.1:$redis_port/0"
export OBSERVATORY_BROWSER_TESTS=1
export OBSERVATORY_DEMO_TESTS=1  # tests/dashboard/test_demo_command.py runs deploy/demo.sh (SQLite pass)
export PYTHONDONTWRITEBYTECODE=1
js_dir=.cache/interop-js
if command -v node >/dev/null && command -v npm >/dev/null; then
  echo "== JS exporters for the interop tests (npm ci into $js_dir) =="
  mkdir -p "$js_dir"
  if ! cmp -s tests/interop/js/package-lock.json "$js_dir/package-lock.json" || [ ! -d "$js_dir/node_modules" ]; then
    cp tests/interop/js/package.json tests/interop/js/package-lock.json "$js_dir/"
    (cd "$js_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
  fi
  export OBSERVATORY_JS_MODULES="$PWD/$js_dir/node_modules"
else
  echo "== node/npm not found: the JS exporter interop tests will be skipped =="
fi

echo "== lint (ruff, rules in pyproject.toml) =="
.venv/bin/ruff check --no-cache .

echo "== whole suite on SQLite =="
OBSERVATORY_DATA_DIR="$work/data-sqlite" .venv/bin/pytest -q -p no:cacheprovider "$@"

echo "== dashboard suite on PostgreSQL =="
OBSERVATORY_DATA_DIR="$work/data-pg" DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres" \
  .venv/bin/pytest -q -p no:cacheprovider tests/dashboard "$@"
