"""Planning spends from the work budget per item, not only per encoded character: a re-sent large
Responses body of one-character items gives up on the loop after a bounded number of items and is
planned in a thread.
"""

from __future__ import annotations

import json

from tests.adversarial.conftest import post


def many_items(count: int, seed: int) -> bytes:
    items = [{"role": "user" if i % 2 == 0 else "assistant", "content": "ab"[(i + seed) % 2]} for i in range(count)]
    return json.dumps({"model": "gpt-4o", "input": items}).encode()


async def test_a_re_sent_responses_body_of_one_character_items_does_not_hold_the_loop(serve_guard, prober):
    guard = await serve_guard()
    url = guard.url("/v1/responses")
    bodies = [many_items(24_000, seed) for seed in range(2)]  # about 1 MiB each, under the inline plan size
    assert all(len(body) < 1024 * 1024 for body in bodies)
    for body in bodies:  # first sent: parsed and counted; what follows is a re-send
        status, answer, _ = await post(url, body)
        assert status < 500, answer[:300]
    base = await prober.baseline(guard)
    async with prober.during(guard) as during:
        answers = [await post(url, body) for body in bodies for _ in range(2)]
    assert all(status < 500 for status, _, _ in answers)
    prober.assert_responsive(base, during)
