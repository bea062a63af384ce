"""The official OpenTelemetry JS exporters (@opentelemetry/exporter-trace-otlp-http,
JSON, and @opentelemetry/exporter-trace-otlp-proto), run with node from the
package-lock under tests/interop/js, against a real gunicorn and the OTLP/HTTP
receiver (``manage.py otlp_http``). They send
``Transfer-Encoding: chunked`` bodies: every span must be stored exactly once.

The packages are installed by deploy/test.sh (``npm ci`` into a cache folder named
by OBSERVATORY_JS_MODULES, default .cache/interop-js/node_modules); without node,
or without the packages there, these tests are skipped, saying so.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from .interop import ROOT, exporter_env, last_json, running_stack

SPANS = 250
MODULES = Path(os.environ.get("OBSERVATORY_JS_MODULES", ROOT / ".cache" / "interop-js" / "node_modules"))
NODE = shutil.which("node")

pytestmark = [
    pytest.mark.skipif(NODE is None, reason="node is not installed: the JS exporter interop tests need it"),
    pytest.mark.skipif(
        not (MODULES / "@opentelemetry" / "exporter-trace-otlp-proto").is_dir(),
        reason="the JS exporters are not installed in OBSERVATORY_JS_MODULES "
        "(default .cache/interop-js/node_modules): deploy/test.sh installs them (npm ci)",
    ),
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with running_stack(tmp_path_factory.mktemp("interop-js")) as running:
        yield running


@pytest.mark.parametrize("protocol", ["json", "proto"])
@pytest.mark.parametrize("compression", ["none", "gzip"])
@pytest.mark.parametrize("to", ["dashboard", "receiver"])
def test_it_stores_every_span_of_the_js_exporters_once(stack, protocol, compression, to):
    conversation = f"conv-js-{protocol}-{compression}-{to}"
    env = exporter_env(stack, protocol="http/json" if protocol == "json" else "http/protobuf", compression=compression,
                       receiver=to == "receiver")
    env["NODE_PATH"] = str(MODULES)
    done = stack.run_client([NODE, "tests/interop/js/export_spans.js", protocol, conversation, str(SPANS)], env)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    report = last_json(done.stdout)
    assert report["failed"] == 0
    stored = dict(stack.rows(
        "SELECT s.span_id, count(*) FROM observatory_span s JOIN observatory_conversation c ON c.id = s.conversation_id"
        " WHERE c.external_id = ? GROUP BY s.span_id", (conversation,)))
    assert len(report["sent"]) == SPANS
    assert stored == {span_id: 1 for span_id in report["sent"]}  # 100% delivered, none twice
    (pk,), = stack.rows("SELECT id FROM observatory_conversation WHERE external_id = ?", (conversation,))
    page = stack.page(f"/p/{stack.project_slug}/conversations/{pk}/")
    assert conversation in page
