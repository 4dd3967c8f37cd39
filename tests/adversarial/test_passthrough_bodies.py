"""A pass-through body's `model` is read off the event loop when the body is large.

A body over `INLINE_BYTES` sent to a pass-through endpoint (`/v1/embeddings`) is read for its
model in the client's share of the threads; a dense one (proxy.wire.codec) is not read for
a name at all, and the others are read without building their values
(proxy.wire.top_level_model), since a whole parse by orjson in a thread holds the GIL while it
builds them.
"""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest

from tests.adversarial.conftest import post

ATTACKERS = [{"Authorization": f"Bearer attacker-{i}"} for i in range(2)]


def braces(size: int, unit: bytes) -> bytes:
    head = b'{"input": "hi", "x": ['
    return head + unit * (size // len(unit)) + b'{}], "model": "text-embedding-3-small"}'


@pytest.mark.parametrize(
    "unit",
    [
        pytest.param(b"{},", id="dense"),
        pytest.param(b'{"a": "' + b"b" * 40 + b'"},', id="within-density"),
    ],
)
async def test_two_clients_sending_large_pass_through_bodies_do_not_hold_the_loop(serve_guard, prober, unit):
    guard = await serve_guard()
    body = gzip.compress(braces(3_900_000, unit), 6)
    headers = {"Content-Encoding": "gzip"}
    base = await prober.baseline(guard)
    async with prober.during(guard) as during:
        answers = await asyncio.gather(
            *(post(guard.url("/v1/embeddings"), body, {**headers, **who}) for who in ATTACKERS for _ in range(2))
        )
    for status, answer, _ in answers:
        assert status < 500, answer[:300]
        if status >= 400:
            assert "error" in json.loads(answer)  # the upstream's own answer, relayed
    prober.assert_responsive(base, during)
