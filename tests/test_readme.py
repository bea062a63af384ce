"""The README's commands and example are what the project really does."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def python_block_after(heading: str) -> str:
    section = README.split(heading, 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_it_keeps_exactly_two_setup_commands_up_front():
    first_block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in first_block.splitlines() if line.strip()]
    assert commands == ["./deploy/demo.sh", "./deploy/test.sh"]
    assert "deploy/test.sh" in (ROOT / ".ci" / "run").read_text()
    for script in commands:
        assert (ROOT / script).stat().st_mode & 0o111, f"{script} is not executable"


@pytest.mark.django_db(transaction=True)
def test_it_runs_the_library_example_against_a_live_dashboard(live_server, api_key, project, tmp_path):
    from dashboard.observatory.models import Span, ToolExecution

    code = python_block_after("## Use the pipeline in an agent")
    placeholder = 'endpoint, key = "http://127.0.0.1:8000", "po_xxxx_yyyy"'
    assert placeholder in code
    code = code.replace(placeholder, f"endpoint, key = {live_server.url!r}, {api_key!r}")
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "Found 12 items"
    execution = ToolExecution.objects.get(project=project)
    assert (execution.tool_name, execution.tool_call_id, execution.success) == ("query_sales", "toolu_01", True)
    assert execution.conversation.external_id == "conv-42"
    span = Span.objects.get(project=project, name="execute_tool query_sales")
    assert span.attributes["gen_ai.tool.call.id"] == "toolu_01"


@pytest.mark.parametrize("name", ["DEMO_PORT", "DEMO_GRPC_PORT", "DEMO_OTLP_HTTP_PORT", "OBSERVATORY_DATA_DIR"])
def test_it_says_how_to_move_the_demo_to_other_ports_and_data(name):
    demo = (ROOT / "deploy" / "demo.sh").read_text()
    assert "${" + name + ":-" in demo  # the variable the README names is the one the script reads
    command = re.search(r"```bash\n(DEMO_PORT=.*?)```", README, re.S).group(1)
    assert re.search(rf"\b{name}=\S+", command) and command.strip().endswith("./deploy/demo.sh")


def test_its_exporter_example_sends_gzip_and_names_the_limit():
    from django.conf import settings

    section = README.split("## Send spans and logs", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    assert re.search(r"^export OTEL_EXPORTER_OTLP_COMPRESSION=gzip\b", block, re.M)
    limit = re.search(r"COMPRESSION=gzip\s+# a body over (\d+) MiB as sent is refused \(413\)", block).group(1)
    assert int(limit) * 1024 * 1024 == settings.OBSERVATORY_MAX_BODY_BYTES
