"""Nothing heavy runs on the event loop, for every endpoint: a large count_tokens body is counted
off it, the recent-decisions page renders big names off it, and a body of letters without spaces
just under `server.offload_bytes` is bounded without long work on it. Each test sends its attack
while the guard's loop is watched (`tests/adversarial/conftest.py`).
"""

from __future__ import annotations

import asyncio
import json
import random
import string

from proxy.server.observation.recent import MAX_NAME_CHARS, RECENT
from proxy.server.observation.record import RequestRecord
from tests.adversarial.conftest import anthropic_body_of, body_of, get, post

COUNT_TOKENS = "/v1/messages/count_tokens"


def letters(size: int, seed: int = 1) -> str:
    """Random letters with no spaces: the text that costs a BPE tokenizer most per byte."""
    rng = random.Random(seed)
    return "".join(rng.choices(string.ascii_letters, k=size))


class TestCountTokens:
    async def test_a_large_count_tokens_body_is_counted_off_the_loop(self, serve_guard, prober):
        guard = await serve_guard()
        body = anthropic_body_of(letters(1_500_000), model="gpt-4o")  # about a second of counting
        base = await prober.baseline(guard)
        async with prober.during(guard) as during:
            status, answer, _ = await post(guard.url(COUNT_TOKENS), body)
        assert status == 200, answer[:300]
        assert json.loads(answer)["input_tokens"] > 100_000
        prober.assert_responsive(base, during)


class TestMediumBodies:
    async def test_letters_without_spaces_below_the_offload_size_are_counted_off_the_loop(self, serve_guard, prober):
        """Below `server.offload_bytes`, a body over INLINE_BYTES is still planned in a thread:
        letters without spaces are the text that costs a tokenizer most per byte."""
        guard = await serve_guard()
        body = body_of(letters(150_000))  # fits gpt-4o's window: counted, not trimmed
        base = await prober.baseline(guard)
        async with prober.during(guard) as during:
            answers = await asyncio.gather(*(post(guard.url("/v1/chat/completions"), body) for _ in range(4)))
        assert [status for status, _, _ in answers] == [200] * 4
        prober.assert_responsive(base, during)


class TestRecentDecisionsPage:
    async def test_a_page_of_rows_with_huge_names_is_bounded_and_rendered_off_the_loop(
        self, serve_guard, prober, settings
    ):
        guard = await serve_guard(settings(page={"size": 500}))
        assert guard.app is not None
        recent = guard.app[RECENT]
        huge = "m" * 256 * 1024

        def fill() -> None:  # 500 requests that named 256 KB models, recorded as they end
            for i in range(500):
                record = RequestRecord(f"req-{i}", "POST", "/v1/chat/completions")
                record.kind, record.model, record.served_model, record.upstream = "chat", huge, huge, "fake"
                record.outcome, record.notes = "forwarded", ["n" * 10_000] * 40
                record.finish(200)
                recent.add(record)

        await guard.on_guard_loop(fill)
        base = await prober.baseline(guard)
        async with prober.during(guard) as during:
            html_status, html, _ = await get(guard.url("/context-guard/recent"))
            json_status, data, _ = await get(guard.url("/context-guard/recent.json"))
        assert html_status == json_status == 200
        assert len(html) < 4 * 1024 * 1024 and len(data) < 4 * 1024 * 1024  # names cut: 500 whole rows are hundreds of MB
        rows = json.loads(data)["rows"]
        assert len(rows) == 500 and len(rows[0]["model"]) == MAX_NAME_CHARS + 1  # cut, with an ellipsis
        prober.assert_responsive(base, during)
