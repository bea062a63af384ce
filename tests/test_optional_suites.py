"""The optional suites skip, saying why, where what they need is not installed: they
never error at setup. Each is run as a user would run it (pytest in a subprocess),
with what it needs pointed at an empty place."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_js_interop_tests_skip_without_the_js_packages(tmp_path):
    env = {**os.environ, "OBSERVATORY_JS_MODULES": str(tmp_path)}  # an empty folder: nothing installed
    env.pop("PYTEST_CURRENT_TEST", None)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/dashboard/ingest/test_interop_js.py"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert "error" not in said.lower().replace("errors=", ""), said[-3000:]
    assert "skipped" in said and ("JS exporters are not installed" in said or "node is not installed" in said), said
