"""A model counted by a bound (Claude, Gemini, Gemma, unknown names) counts through the same
safeguards as an OpenAI vocabulary: the work budget (a re-sent conversation and
`/v1/messages/count_tokens` keep heavy counting off the loop), slices, and cancellation (a count
whose client hung up stops).
"""

from __future__ import annotations

import asyncio
import json
import random
import string

from proxy.server.threads.placement import large_body_slots
from tests.adversarial.conftest import anthropic_body_of, cpu_seconds, hang_up_after, post, prose

CLAUDE = "claude-3-5-sonnet-20241022"
COUNT_TOKENS = "/v1/messages/count_tokens"


def words(size: int, seed: int = 3) -> str:
    """Random letters in words of five, one space apart: every slice is really encoded."""
    text = "".join(random.Random(seed).choices(string.ascii_letters, k=size))
    return " ".join(text[i : i + 5] for i in range(0, size, 6))


def conversation(model: str, turns: int, size: int) -> dict[str, object]:
    """A chat conversation of `turns` messages of about `size` bytes of prose in all."""
    each = size // turns
    roles = ["user", "assistant"]
    messages = [{"role": roles[i % 2], "content": f"{i} " + prose(each)} for i in range(turns)]
    return {"model": model, "max_tokens": 16, "messages": messages}


class TestReSentBoundBodies:
    async def test_a_claude_conversation_over_the_window_re_sent_does_not_hold_the_loop(self, serve_guard, prober):
        """Its messages' counts are cached, but the cut ones are counted again each time: that
        counting spends from the work budget and leaves the loop when the budget is spent."""
        guard = await serve_guard()
        chat = guard.url("/v1/chat/completions")
        first = conversation(CLAUDE, 8, 1_000_000)  # 1 MB of prose: over Claude's window, trimmed
        body = json.dumps(first).encode()
        status, answer, _ = await post(chat, body)
        assert status == 200, answer[:300]
        turn = {"role": "user", "content": "And then?"}
        again = json.dumps(dict(first, messages=[*first["messages"], turn])).encode()  # type: ignore[list-item]
        base = await prober.baseline(guard)
        async with prober.during(guard) as during:
            answers = [await post(chat, body), await post(chat, again)]
        assert [status for status, _, _ in answers] == [200, 200]
        prober.assert_responsive(base, during)


class TestCountTokensOfABound:
    async def test_a_large_claude_count_tokens_body_is_counted_off_the_loop(self, serve_guard, prober):
        """No upstream and no credential: count_tokens is answered by the guard alone."""
        guard = await serve_guard()
        # Under `server.offload_bytes`, each new: parsed in a thread, planned on the loop within its budget.
        bodies = [anthropic_body_of(words(200_000, seed), model=CLAUDE) for seed in range(4)]
        base = await prober.baseline(guard)
        async with prober.during(guard) as during:
            answers = await asyncio.gather(*(post(guard.url(COUNT_TOKENS), body) for body in bodies))
        for status, answer, _ in answers:
            assert status == 200, answer[:300]
            assert json.loads(answer)["input_tokens"] > 200_000 // 6  # at least a token a word
        prober.assert_responsive(base, during)

    async def test_a_count_for_an_unknown_model_is_bounded_as_well(self, serve_guard, prober):
        guard = await serve_guard()
        bodies = [anthropic_body_of(words(200_000, seed), model="some-model-nobody-knows") for seed in range(4)]
        base = await prober.baseline(guard)
        async with prober.during(guard) as during:
            answers = await asyncio.gather(*(post(guard.url(COUNT_TOKENS), body) for body in bodies))
        assert [status for status, _, _ in answers] == [200] * 4
        prober.assert_responsive(base, during)


class TestHangingUp:
    async def test_a_claude_count_stops_within_2_s_of_cpu_after_its_client_hangs_up(self, serve_guard):
        guard = await serve_guard()
        body = anthropic_body_of(words(16 * 1024 * 1024), model=CLAUDE)  # about 10 s of counting

        async def busy() -> int:
            return await guard.on_guard_loop(lambda: large_body_slots().busy)

        sending = asyncio.create_task(hang_up_after(guard.url(COUNT_TOKENS), body, 30))
        for _ in range(400):  # until its work runs in a large-body thread (a poll, 10 s at most)
            if await busy():
                break
            await asyncio.sleep(0.025)
        # Hung up while parsing or while counting: either way no counting goes on after.
        sending.cancel()
        left = cpu_seconds()
        for _ in range(400):
            if not await busy():
                break
            await asyncio.sleep(0.025)
        spent = cpu_seconds() - left
        assert not await busy(), "the count went on after its client left"
        # CPU time, not wall time (the machine's load does not move it), far under what counting the whole body costs.
        assert spent < 2.0, f"{spent:.1f} s of CPU after the client hung up"
