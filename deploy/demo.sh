#!/usr/bin/env bash
# README command 1: set up the dashboard, start it on http://127.0.0.1:8000 and fill it with
# the demo agent, then keep serving until Ctrl-C.
#
#   deploy/demo.sh               # set up, fill, serve in the foreground
#   deploy/demo.sh --no-serve    # set up and fill, then stop the server (also DEMO_EXIT=1)
#
# Embedded mode: SQLite and artifacts in $OBSERVATORY_DATA_DIR (default var/demo), Celery tasks
# run on a background thread of the web process (no broker). The server is gunicorn with
# deploy/gunicorn.conf.py, as in production; static files come from the app (WhiteNoise).
# Re-running reuses the user and the project and makes a new API key.
#
# OTLP/gRPC (manage.py otlp_grpc) listens beside it on 127.0.0.1:4317 (DEMO_GRPC_PORT), so
# exporters set to OTEL_EXPORTER_OTLP_PROTOCOL=grpc deliver too, and the OTLP/HTTP receiver
# (manage.py otlp_http, for many small batches) on 127.0.0.1:4318 (DEMO_OTLP_HTTP_PORT); all
# stop together. Both receivers start through their deploy scripts, so at a lower CPU priority
# than the pages (OBSERVATORY_INGEST_NICE, 10), as deployed.
#
# Environment: DEMO_PORT (8000), DEMO_GRPC_PORT (4317), DEMO_OTLP_HTTP_PORT (4318), DEMO_USER (admin),
# DEMO_PASSWORD (generated once, kept in the data dir), DEMO_CONVERSATIONS (40), DEMO_SEED (new each run),
# DEMO_EXTRAS (dashboard,langchain).
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/lib.sh

serve=1
[ "${DEMO_EXIT:-0}" = 1 ] && serve=0
for arg in "$@"; do
  case "$arg" in
    --no-serve) serve=0 ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (try --help)" >&2; exit 2 ;;
  esac
done

ensure_venv "${DEMO_EXTRAS:-dashboard,langchain}"
PY=.venv/bin/python

export OBSERVATORY_DATA_DIR="${OBSERVATORY_DATA_DIR:-var/demo}"
mkdir -p "$OBSERVATORY_DATA_DIR"
data_dir=$(cd "$OBSERVATORY_DATA_DIR" && pwd)
export OBSERVATORY_DATA_DIR="$data_dir"
unset DATABASE_URL CELERY_BROKER_URL       # the embedded product: SQLite, eager tasks
export DEBUG=0 SESSION_COOKIE_SECURE=0     # plain http on the loopback interface
port="${DEMO_PORT:-8000}"
user="${DEMO_USER:-admin}"
base="http://127.0.0.1:$port"

# Secrets made once and kept (mode 600) in the data dir, so a re-run keeps sessions and login.
secret_file() {
  local file="$data_dir/$1"
  if [ ! -s "$file" ]; then
    (umask 077; "$PY" -c 'import secrets, sys; print(secrets.token_urlsafe(int(sys.argv[1])))' "$2" >"$file")
  fi
  cat "$file"
}
export SECRET_KEY="${SECRET_KEY:-$(secret_file secret_key 50)}"
password="${DEMO_PASSWORD:-$(secret_file demo_password 12)}"

grpc_port="${DEMO_GRPC_PORT:-4317}"
otlp_http_port="${DEMO_OTLP_HTTP_PORT:-4318}"
listening() {
  "$PY" - "$1" <<'PY'
import socket, sys
s = socket.socket()
sys.exit(0 if s.connect_ex(("127.0.0.1", int(sys.argv[1]))) == 0 else 1)
PY
}
if listening "$port"; then
  echo "Something already listens on 127.0.0.1:$port; stop it or set DEMO_PORT." >&2
  exit 1
fi
if listening "$grpc_port"; then
  echo "Something already listens on 127.0.0.1:$grpc_port; stop it or set DEMO_GRPC_PORT." >&2
  exit 1
fi
if listening "$otlp_http_port"; then
  echo "Something already listens on 127.0.0.1:$otlp_http_port; stop it or set DEMO_OTLP_HTTP_PORT." >&2
  exit 1
fi

echo "== database ($data_dir)"
"$PY" manage.py migrate --noinput >/dev/null
OBSERVATORY_PASSWORD="$password" "$PY" manage.py createuser "$user" --superuser >/dev/null
if "$PY" manage.py shell -c "
import sys
from dashboard.accounts.models import Project
sys.exit(0 if Project.objects.filter(slug='demo').exists() else 1)" >/dev/null 2>&1; then
  echo "project demo: exists, reused"
else
  "$PY" manage.py createproject demo --slug demo --member "$user"
fi
# A price for the demo's model (else every cost reads "no price"), and a compression profile and a
# tool output policy fitted to its window when the project has none (Admin > Tuning).
"$PY" manage.py seed_demo demo | sed 's/^/  /'
api_key=$("$PY" manage.py createapikey demo --name "demo-$(date +%Y%m%d-%H%M%S)" 2>/dev/null)

echo "== server on $base (log: $data_dir/server.log)"
OBSERVATORY_BIND="127.0.0.1:$port" "$PY" -m gunicorn --config deploy/gunicorn.conf.py dashboard.wsgi:application \
  >"$data_dir/server.log" 2>&1 &
server_pid=$!
echo "== OTLP/gRPC on 127.0.0.1:$grpc_port (log: $data_dir/grpc.log)"
OBSERVATORY_GRPC_HOST=127.0.0.1 OBSERVATORY_GRPC_PORT="$grpc_port" PYTHON="$PY" deploy/run-grpc.sh >"$data_dir/grpc.log" 2>&1 &
grpc_pid=$!
echo "== OTLP/HTTP receiver on 127.0.0.1:$otlp_http_port (log: $data_dir/otlp-http.log)"
OBSERVATORY_OTLP_HTTP_HOST=127.0.0.1 OBSERVATORY_OTLP_HTTP_PORT="$otlp_http_port" PYTHON="$PY" deploy/run-otlp-http.sh \
  >"$data_dir/otlp-http.log" 2>&1 &
otlp_http_pid=$!
stop_server() {
  trap - EXIT INT TERM
  for pid in "$server_pid" "$grpc_pid" "$otlp_http_pid"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
    fi
  done
  wait "$server_pid" "$grpc_pid" "$otlp_http_pid" 2>/dev/null || true
}
trap stop_server EXIT
trap 'stop_server; exit 130' INT
trap 'stop_server; exit 143' TERM

if ! "$PY" - "$base/accounts/login/" "$server_pid" <<'PY'
import os, sys, time, urllib.request
url, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("the server exited")
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            if answer.status == 200:
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.3)
sys.exit("the server did not answer within 60 s")
PY
then
  echo "The server did not start; its log:" >&2
  tail -n 30 "$data_dir/server.log" >&2
  exit 1
fi

# wait_listening NAME PORT PID LOG: until PORT takes connections, or say why not and stop.
wait_listening() {
  if ! "$PY" - "$1" "$2" "$3" <<'PY'
import os, socket, sys, time
name, port, pid = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit(f"the {name} exited")
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", port)) == 0:
            sys.exit(0)
    time.sleep(0.3)
sys.exit(f"the {name} did not listen within 60 s")
PY
  then
    echo "The $1 did not start; its log:" >&2
    tail -n 30 "$4" >&2
    exit 1
  fi
}
wait_listening "OTLP/gRPC receiver" "$grpc_port" "$grpc_pid" "$data_dir/grpc.log"
wait_listening "OTLP/HTTP receiver" "$otlp_http_port" "$otlp_http_pid" "$data_dir/otlp-http.log"

echo "== demo agent"
agent_status=0
"$PY" -m pipeline.demo --endpoint "$base" --api-key "$api_key" \
  --conversations "${DEMO_CONVERSATIONS:-40}" --seed "${DEMO_SEED:-$("$PY" -c 'import secrets; print(secrets.randbelow(10**9))')}" \
  --work-dir "$data_dir/agent" || agent_status=$?

cat <<EOF

Pipeline Observatory is filled with the demo agent's conversations.
  Open        $base/
  Log in as   $user / $password
  API key     $api_key   (shown once; for your own agents: --api-key or OTEL_EXPORTER_OTLP_HEADERS)
  OTLP        $base/v1/traces, $base/v1/logs, $base/v1/metrics (http/protobuf, http/json); grpc://127.0.0.1:$grpc_port;
              many small batches: http://127.0.0.1:$otlp_http_port/v1/traces (the OTLP/HTTP receiver)
EOF
if [ "$agent_status" -ne 0 ]; then
  echo "Warning: the demo agent exited with $agent_status (see above)." >&2
fi
if [ "$serve" = 0 ]; then
  exit "$agent_status"
fi
echo "Serving until Ctrl-C."
wait "$server_pid"
