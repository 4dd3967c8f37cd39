"""Issue 39, item 3: dense JSON in a field the guard does not read, sent plain or as a small gzip upload.

Before, 30 MiB of `[],` made +917 MB of parsed objects and an 813 ms loop stall (the parsing
thread held the GIL); gzipped it is a 30 KB upload. Its values are weighed before parsing now
(peak memory: tests/adversarial/test_bounds_memory.py), and it is refused in the API's shape.
"""

from __future__ import annotations

import gzip
import json

import pytest

from tests.adversarial.conftest import post


def dense(size: int) -> bytes:
    head = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()[:-1]
    return head + b', "unread": [' + b"[]," * (size // 3) + b"0]}"


@pytest.mark.parametrize("encoding", ["identity", "gzip"])
async def test_30_mb_of_empty_arrays_is_refused_without_holding_the_loop(serve_guard, prober, encoding):
    guard = await serve_guard()
    raw = dense(30 * 1024 * 1024)
    body = gzip.compress(raw, 6) if encoding == "gzip" else raw
    headers = {"Content-Encoding": "gzip"} if encoding == "gzip" else {}
    base = await prober.baseline(guard)
    async with prober.during(guard) as during:
        status, answer, _ = await post(guard.url("/v1/chat/completions"), body, headers)
    assert status == 400, answer[:300]
    error = json.loads(answer)["error"]
    assert error["type"] == "invalid_request_error" and "too dense" in error["message"]
    prober.assert_responsive(base, during)
