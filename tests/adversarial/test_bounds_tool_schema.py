"""Issue 24, item 1: a tool schema that expands exponentially costs bounded work, and is counted
by an upper bound that the log and the headers call an estimate.

On main a 2,135-byte tool (`$defs` each referring to the next 3 times, 13 deep) took 4.4 s and
545 MB and counted 10.6 million tokens; K=4 would be about 55 times worse. Here the K=4 chain is
sent as a body planned on the loop (at most `INLINE_BYTES`) and as one planned in a thread while
`/livez` is probed.
"""

from __future__ import annotations

import asyncio
import io
import json

import pytest

from proxy.logging import configure_logging
from proxy.server.threads.placement import INLINE_BYTES
from tests.adversarial.conftest import assert_refused_over_window, body_of, post
from tests.adversarial.hostile import chat_with_tool, plain_function, ref_chain

CHAT = "/v1/chat/completions"
SMALL_CHAIN = ref_chain(4, 13)
# Found by this test (November 2026): a body of at most INLINE_BYTES is planned on the loop, and the
# tool renderer's budget (RENDER_BUDGET, 4M characters built) is the same whatever the schema's
# size, so this 2.3 KB body holds the loop 60-140 ms per request. The fix belongs to the core (a
# render budget proportional to the function's bytes) or to the shell (tools planned off the loop).
PADDED_CHAIN = {**SMALL_CHAIN, "description": "Look a record up by its key. " * 200}  # planned in a thread


@pytest.fixture
def log_lines() -> io.StringIO:
    stream = io.StringIO()
    configure_logging("json", "info", stream=stream)
    return stream


async def request_lines(stream: io.StringIO, expected: int) -> list[dict]:
    """The request log lines, once `expected` are written (a line is written as its answer ends)."""
    for _ in range(100):
        lines = [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
        requests = [line for line in lines if line.get("event") == "request"]
        if len(requests) >= expected:
            return requests
        await asyncio.sleep(0.05)
    return requests


class TestRefChain:
    def test_the_small_chain_is_planned_on_the_loop(self) -> None:
        assert len(chat_with_tool(SMALL_CHAIN)) <= INLINE_BYTES < len(chat_with_tool(PADDED_CHAIN))

    @pytest.mark.parametrize(
        "function",
        [
            pytest.param(SMALL_CHAIN, id="on-the-loop"),
            pytest.param(PADDED_CHAIN, id="in-a-thread"),
        ],
    )
    async def test_a_ref_chain_does_not_stall_the_loop_and_is_counted_as_an_estimate(
        self, serve_guard, prober, log_lines, function
    ) -> None:
        guard = await serve_guard()
        await post(guard.url(CHAT), body_of("warm up"))  # the vocabulary loads once, holding the GIL: not the attack's
        body = chat_with_tool(function)
        base = await prober.baseline(guard)
        async with prober.during(guard) as during:
            answers = [await post(guard.url(CHAT), body) for _ in range(6)]
        prober.assert_responsive(base, during)
        assert_refused_over_window(answers)
        lines = await request_lines(log_lines, 7)
        assert len(lines) == 7
        lines = lines[1:]
        for line in lines:
            # The bound: past any window, never below the chain written out (4**13 leaves of a token or more).
            assert line["tokens_before"] >= 4**13 and line["tokens_before"] > line["budget"]
            assert line["exact"] is False and "estimate" in line["notes"]

    async def test_an_honest_tool_of_the_same_size_is_counted_exactly_and_forwarded(
        self, serve_guard, log_lines
    ) -> None:
        guard = await serve_guard()
        body = chat_with_tool(plain_function(len(json.dumps(SMALL_CHAIN))))
        status, answer, _ = await post(guard.url(CHAT), body)
        assert status == 200 and json.loads(answer)["object"] == "chat.completion", answer[:300]
        (line,) = await request_lines(log_lines, 1)
        assert line["exact"] is True and line["tokens_before"] < 2_000
