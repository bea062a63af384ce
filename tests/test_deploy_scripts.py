"""The deploy scripts start the ingest servers at a lower CPU priority than the pages
(issue 33: priority by process, deploy/SCALING.md): the OTLP receivers run under
``nice -n OBSERVATORY_INGEST_NICE`` (10 unless set; 0 leaves them as they are).

The scripts run for real; only the Python they start is a fake (``PYTHON``, the
scripts' own setting): it prints the niceness it runs at and its arguments, instead
of starting a server."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECEIVERS = {"run-otlp-http.sh": "manage.py otlp_http", "run-grpc.sh": "manage.py otlp_grpc"}
NICEST = 19  # the kernel's lowest priority: nice stops there


@pytest.fixture
def fake_python_printing_its_niceness(tmp_path: Path) -> Path:
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import os, sys; print(os.nice(0), *sys.argv[1:])' \"$@\"\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return fake


def _run(script: str, python: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "OBSERVATORY_INGEST_NICE"}
    return subprocess.run([str(ROOT / "deploy" / script)], env={**environment, "PYTHON": str(python), **env},
                          capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize("script", sorted(RECEIVERS))
@pytest.mark.parametrize(("setting", "lowered_by"), [(None, 10), ("4", 4), ("0", 0)])
def test_a_receiver_s_script_starts_it_at_a_lower_priority(fake_python_printing_its_niceness, script, setting,
                                                          lowered_by):
    ours = os.nice(0)
    done = _run(script, fake_python_printing_its_niceness,
                **({"OBSERVATORY_INGEST_NICE": setting} if setting is not None else {}))
    assert done.returncode == 0, done.stderr
    niceness, command = done.stdout.strip().split(" ", 1)
    assert int(niceness) == min(ours + lowered_by, NICEST)
    assert command == RECEIVERS[script]


@pytest.mark.parametrize("script", sorted(RECEIVERS))
def test_a_setting_that_is_no_number_stops_the_script(fake_python_printing_its_niceness, script):
    done = _run(script, fake_python_printing_its_niceness, OBSERVATORY_INGEST_NICE="low")
    assert done.returncode != 0 and done.stdout == ""  # never started at the pages' priority instead
    assert "low" in done.stderr


def test_the_demo_starts_its_receivers_through_those_scripts():
    """So the demo's receivers are niced as the deployment's are, by the same line."""
    code = [line for line in (ROOT / "deploy" / "demo.sh").read_text().splitlines() if not line.lstrip().startswith("#")]
    for script, command in RECEIVERS.items():
        assert any(f"deploy/{script}" in line for line in code)
        assert not any(command in line for line in code)  # not started a second way, un-niced
