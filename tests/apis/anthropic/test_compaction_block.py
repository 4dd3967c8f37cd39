"""Anthropic's compaction block (server-side compaction, `compact_20260112`): the conversation starts
there. What precedes it is not counted (Anthropic drops it) and goes first when a cut is needed;
the block itself is never dropped nor shortened."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.apis.anthropic.messages import MessagesAdapter
from proxy.core.trimming.strategies import DEFAULT_PIPELINE
from tests.apis.fitting import fit_body, words
from tests.support.cookbook import encoding
from tests.support.validity import messages_problems

ADAPTER = MessagesAdapter()
CLAUDE = "claude-sonnet-4-5"
SYSTEM = "You are a careful assistant."
SUMMARY = "Summary of the work so far: " + words(400, "summary")
HEAD_SHARES = [pytest.param(None, id="default"), pytest.param({"drop_oldest_turns": {"head_share": 0}}, id="head0")]


def turns(first: int, count: int, size: int) -> list[dict[str, Any]]:
    """`count` question-and-answer turns of about `size` tokens each side (words of two tokens)."""
    out: list[dict[str, Any]] = []
    for k in range(first, first + count):
        out.append({"role": "user", "content": f"question {k}: " + words(size // 2, f"q{k}")})
        out.append(
            {"role": "assistant", "content": [{"type": "text", "text": f"answer {k}: " + words(size // 2, f"a{k}")}]}
        )
    return out


def body(old: int, newer: int, size: int = 1000, block: dict[str, Any] | None = None) -> dict[str, Any]:
    """`old` turns, the assistant message holding the compaction block, then `newer` turns and a
    last question."""
    compaction = block or {"type": "compaction", "content": SUMMARY}
    messages = [
        *turns(0, old, size),
        {"role": "user", "content": "Go on."},
        {"role": "assistant", "content": [compaction, {"type": "text", "text": "Continuing from the summary."}]},
        *turns(old, newer, size),
        {"role": "user", "content": "What is left to do?"},
    ]
    return {"model": CLAUDE, "max_tokens": 1024, "system": SYSTEM, "messages": messages}


def tiktoken_count(sent: dict[str, Any], start: int = 0) -> int:
    """The text the model reads from message `start` on, with the system prompt, by tiktoken
    directly (o200k), and 4 tokens of framing a message: the tests' own count, not the guard's."""
    enc = encoding("gpt-4o")
    total = len(enc.encode(sent["system"]))
    for message in sent["messages"][start:]:
        content = message["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        total += 4 + sum(len(enc.encode(b.get("text") or b.get("content") or "")) for b in blocks)
    return total


def block_index(sent: dict[str, Any]) -> int:
    return next(
        i
        for i, m in enumerate(sent["messages"])
        if isinstance(m["content"], list) and m["content"][0]["type"] == "compaction"
    )


class TestACompactionBlock:
    def test_a_body_that_fits_from_the_block_on_is_forwarded_unchanged_and_counted_from_it(self):
        """40k tokens of old history, the block and 4k of newer turns, on a 16k window."""
        request = body(old=20, newer=4)
        fitted = fit_body(ADAPTER, request, 16_000, model=CLAUDE)
        after = tiktoken_count(request, block_index(request))
        assert fitted.plan.result.outcome == "unchanged" and fitted.body is request
        assert tiktoken_count(request) > 40_000
        assert after <= fitted.plan.count.total <= 1.5 * after
        assert any("compaction block" in note for note in fitted.parsed.notes)

    @pytest.mark.parametrize("options", HEAD_SHARES)
    def test_over_the_window_from_the_block_on_what_precedes_it_goes_first_and_the_block_stays(self, options):
        """Newer turns of 20k tokens after the block: the old history is gone, the block kept whole
        and first, the latest turn intact, and the body within budget by the tests' own count."""
        request = body(old=20, newer=10, size=2000)
        fitted = fit_body(ADAPTER, request, 16_000, model="gpt-4o", options=options)
        result, sent = fitted.plan.result, fitted.body
        assert result.outcome == "trimmed" and result.fits
        assert sent["messages"][0]["content"][0] == {"type": "compaction", "content": SUMMARY}
        assert sent["messages"][-1] == request["messages"][-1] and sent["messages"][-2] == request["messages"][-2]
        assert not any(m in sent["messages"] for m in request["messages"][:41])
        assert tiktoken_count(sent) <= result.budget.input_budget
        # It opens with the assistant message holding the block: where Anthropic itself starts reading.
        assert messages_problems(sent) == ["messages.0: the first message is not a user message"]

    def test_blocks_before_the_compaction_block_in_its_message_go_with_the_history(self):
        request = body(old=3, newer=10, size=2000)
        held = request["messages"][7]
        request["messages"][7] = {**held, "content": [{"type": "text", "text": "Before."}, *held["content"]]}
        sent = fit_body(ADAPTER, request, 16_000).body
        assert sent["messages"][0]["content"][0]["type"] == "compaction" and len(sent["messages"][0]["content"]) >= 1

    def test_only_the_newest_block_counts_and_a_failed_one_is_no_marker(self):
        newest = body(old=2, newer=1)
        newest["messages"][1]["content"].insert(0, {"type": "compaction", "content": "older summary"})
        assert fit_body(ADAPTER, newest, 200_000).parsed.notes[0].startswith("messages.5.content.0")
        failed = body(old=2, newer=1, block={"type": "compaction", "content": None})
        assert not any("compaction block" in note for note in fit_body(ADAPTER, failed, 200_000).parsed.notes)

    def test_the_block_is_never_shortened_even_where_the_system_prompt_may_be(self):
        """`shrink_system` cuts pinned text, the largest first; the compaction block, larger than the
        system prompt here, is what Anthropic starts from: the system prompt is cut instead."""
        request = body(old=2, newer=0, block={"type": "compaction", "content": words(4000, "summary")})
        request["system"] = words(2700, "rule")
        fitted = fit_body(ADAPTER, request, 8_000, pipeline=(*DEFAULT_PIPELINE, "shrink_system"))
        sent = fitted.body
        assert fitted.plan.result.outcome == "trimmed" and "tokens removed" in sent["system"]
        assert sent["messages"][0]["content"][0] == request["messages"][5]["content"][0]
