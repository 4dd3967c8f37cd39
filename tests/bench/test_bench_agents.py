"""bench/agents.py's arithmetic: prompt-cache prices on hand-worked cases, and the shared prefix."""

from __future__ import annotations

from bench.agents import ANTHROPIC, OPENAI, shared_prefix


class TestPricing:
    def test_openai_bills_the_cached_prefix_at_a_tenth_in_steps_of_128(self):
        """3,000 tokens sharing 2,000: 1,920 cached (15 x 128) at 0.1, 1,080 at full price."""
        assert OPENAI.cost(3000, 2000) == 1920 * 0.1 + 1080

    def test_openai_caches_nothing_under_1024_tokens(self):
        assert OPENAI.cost(3000, 1000) == 3000

    def test_anthropic_reads_the_prefix_at_a_tenth_and_writes_the_rest_at_one_and_a_quarter(self):
        assert ANTHROPIC.cost(3000, 2000) == 2000 * 0.1 + 1000 * 1.25
        assert ANTHROPIC.cost(3000, 0) == 3750

    def test_a_prefix_longer_than_the_request_is_billed_as_the_request(self):
        assert ANTHROPIC.cost(1500, 4000) == 150


class TestSharedPrefix:
    def test_the_tools_and_the_equal_leading_messages_are_shared(self):
        before = [("system", 10), ("user", 20), ("old result", 30)]
        after = [("system", 10), ("user", 20), ("cleared", 5), ("new", 40)]
        assert shared_prefix(before, after, fixed=7) == 7 + 10 + 20

    def test_the_first_request_shares_nothing(self):
        assert shared_prefix(None, [("system", 10)], fixed=7) == 0
