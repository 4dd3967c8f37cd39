"""A text of about a million spaces or tabs (which makes tiktoken panic with a `BaseException`)
is counted by a bound (one token per byte) and the request is answered, with one JSON log line
and nothing else: no closed connection, no backtrace in the log.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.server.conftest import gateway_settings, logs, start_proxy, upstream  # noqa: F401  # fixtures

MILLION = 1_000_000


async def post(proxy: Any, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.make_url("/v1/chat/completions"), json=body) as response:
            return response.status, json.loads(await response.read())


class TestWhitespaceFloods:
    @pytest.mark.parametrize("model", ["gpt-4.1", "gpt-4o"])
    @pytest.mark.parametrize("flood", [" " * MILLION, "\t" * MILLION], ids=["spaces", "tabs"])
    async def test_a_flood_is_served_with_one_log_line(self, start_proxy, upstream, logs, capfd, flood, model):  # noqa: F811
        proxy = await start_proxy(gateway_settings(upstream.url))
        capfd.readouterr()
        status, answer = await post(proxy, {"model": model, "messages": [{"role": "user", "content": flood}]})
        assert status == 200, answer
        forwarded = upstream.received[-1].json()["messages"][0]["content"]
        assert flood[:1000] in forwarded  # forwarded, cut to fit the bound
        [event] = logs.events("request")
        assert event["exact"] is False and "estimate" in event["notes"]  # counted by a bound, and said so
        out, err = capfd.readouterr()
        assert out == "" and "panicked" not in err
