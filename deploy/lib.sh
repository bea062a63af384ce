# Shared by deploy/demo.sh and deploy/test.sh: sourced, not run.

# ensure_venv EXTRAS: create .venv if missing and install the project with those extras.
# Re-installs only when pyproject.toml changed since the last install (a stamp in .venv).
ensure_venv() {
  local extras="$1" python="${PYTHON:-python3}"
  if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "Python 3.11 or newer is needed ($python is $("$python" --version 2>&1))." >&2
    exit 1
  fi
  [ -x .venv/bin/python ] || "$python" -m venv .venv
  local stamp=".venv/.installed-$extras" want
  want=$(sha256sum pyproject.toml | cut -d' ' -f1)
  if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    echo "Installing Python packages ($extras) into .venv ..."
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
    echo "$want" > "$stamp"
  fi
}

# free_port: print a TCP port on 127.0.0.1 that nothing listens on now.
free_port() {
  .venv/bin/python - <<'PY'
import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])
s.close()
PY
}
