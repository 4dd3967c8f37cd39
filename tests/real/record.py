"""Records what llama-cpp-python's server answers to the guard's discovery, tokenize and overflow
requests, into tests/data/backends/ (run it again after upgrading llama-cpp-python):

    PYTHONPATH=. python -m tests.real.record
"""

from __future__ import annotations

import json
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.real.corpus import body
from tests.real.llama import MODEL, running_server

OUT = Path(__file__).resolve().parents[1] / "data" / "backends"


def call(method: str, url: str, payload: object = None, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(payload).encode() if payload is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read()


def save(name: str, raw: bytes) -> None:
    (OUT / name).write_bytes(json.dumps(json.loads(raw), ensure_ascii=False, indent=1).encode() + b"\n")


def main() -> None:
    with tempfile.TemporaryDirectory() as folder, running_server(Path(folder) / "server.log") as llama:
        save("llama-cpp-python-models.json", call("GET", f"{llama.url}/models")[2])
        save("llama-cpp-python-tokenize-count.json", call("POST", f"{llama.root}/extras/tokenize/count", {"input": "Hello, world!"})[2])
        save("llama-cpp-python-tokenize.json", call("POST", f"{llama.root}/extras/tokenize", {"input": "Hello, world!"})[2])
        small = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, "temperature": 0}
        save("llama-cpp-python-completion.json", call("POST", f"{llama.url}/chat/completions", small)[2])
        over = body("english", 14, MODEL)
        status, _, raw = call("POST", f"{llama.url}/chat/completions", over)
        assert status == 400, status
        save("llama-cpp-python-overflow.json", raw)
        facts: dict[str, Any] = {}
        status, headers, raw = call("POST", f"{llama.url}/chat/completions", {**over, "stream": True})
        facts["over_window_stream"] = {"status": status, "content_type": headers.get("content-type"), "body_bytes": len(raw)}
        status, _, raw = call("GET", f"{llama.root}/props")
        facts["props"] = {"status": status}
        status, _, raw = call("POST", f"{llama.url}/chat/completions", small, {"x-request-id": "not-a-uuid"})
        facts["non_uuid_request_id"] = {"status": status, "body_bytes": len(raw)}
        (OUT / "llama-cpp-python-facts.json").write_text(json.dumps(facts, indent=1) + "\n")


if __name__ == "__main__":
    main()
