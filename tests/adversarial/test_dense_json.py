"""Dense JSON in a field the guard does not read, sent plain or as a small gzip upload, is
weighed before it is parsed and refused in the API's shape, with the loop kept free (its peak
memory: tests/adversarial/test_bounds_memory.py).
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
