"""A tool schema that expands exponentially (`$defs` each referring to the next K times) costs
bounded work, keeps the loop free and is counted by an upper bound that the log and the headers
call an estimate. The K=4 chain is sent as a body planned on the loop (at most `INLINE_BYTES`)
and as one planned in a thread, while the guard's loop is watched.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading

import pytest

from proxy.logging import configure_logging
from proxy.server.threads.placement import INLINE_BYTES
from tests.adversarial.conftest import assert_refused_over_window, body_of, post
from tests.adversarial.hostile import chat_with_tool, plain_function, ref_chain

CHAT = "/v1/chat/completions"
SMALL_CHAIN = ref_chain(4, 13)
# A body of at most INLINE_BYTES is planned on the loop, and the tool renderer's budget
# (RENDER_BUDGET characters built) does not shrink with the schema's size: the small chain is the
# worst a body planned on the loop can do, the padded one the same chain planned in a thread.
PADDED_CHAIN = {**SMALL_CHAIN, "description": "Look a record up by its key. " * 200}  # planned in a thread


class LogLines(io.StringIO):
    """The log, as written; each write wakes whoever waits for lines (the guard logs from its own thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Condition()

    def write(self, text: str) -> int:
        with self.written:
            n = super().write(text)
            self.written.notify_all()
        return n

    def requests(self) -> list[dict]:
        lines = [json.loads(line) for line in self.getvalue().splitlines() if line.strip()]
        return [line for line in lines if line.get("event") == "request"]


@pytest.fixture
def log_lines() -> LogLines:
    stream = LogLines()
    configure_logging("json", "info", stream=stream)
    return stream


async def request_lines(stream: LogLines, expected: int) -> list[dict]:
    """The request log lines, once `expected` are written (a line is written as its answer ends), or
    what there is after 5 s."""

    def wait() -> list[dict]:
        with stream.written:
            stream.written.wait_for(lambda: len(stream.requests()) >= expected, timeout=5)
            return stream.requests()

    return await asyncio.to_thread(wait)


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
