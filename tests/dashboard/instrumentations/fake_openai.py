"""A fake OpenAI-compatible chat completions server on 127.0.0.1 (the network edge
of the openai-v2 test): asks for one tool call, then answers; a user message
containing "fail" gets a 400 error response."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOOL_CALL_USAGE = {"prompt_tokens": 31, "completion_tokens": 9, "total_tokens": 40}
ANSWER_USAGE = {"prompt_tokens": 55, "completion_tokens": 8, "total_tokens": 63}
ANSWER = "It is sunny in Paris."


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, document: dict) -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        last = body["messages"][-1]
        if last["role"] == "user" and "fail" in last["content"]:
            self._send(400, {"error": {"message": "the fake refuses", "type": "invalid_request_error"}})
            return
        if last["role"] == "user":
            message = {"role": "assistant", "content": None, "tool_calls": [{
                "id": "call_w1", "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})},
            }]}
            finish, usage = "tool_calls", TOOL_CALL_USAGE
        else:
            message, finish, usage = {"role": "assistant", "content": ANSWER}, "stop", ANSWER_USAGE
        self._send(200, {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": body["model"] + "-2024-07-18",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage,
        })


def fake_openai_server() -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server
