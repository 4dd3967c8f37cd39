"""The Responses API's compaction: every item sent is counted (the provider reads them all), the
turns before the newest `compaction` item go first when a cut is needed, the item is never cut; and a
request that compacts (Codex's `compaction_trigger`, `/v1/responses/compact`) is counted and
fitted as a compaction request: its tool results shortened evenly, its opening and trigger kept."""

from __future__ import annotations

import math
from typing import Any

import pytest

from proxy.apis.openai.responses import ResponsesAdapter, ResponsesCompactAdapter
from tests.apis.fitting import fit_body, words
from tests.support.cookbook import encoding
from tests.support.validity import responses_problems

ADAPTER = ResponsesAdapter()
INSTRUCTIONS = "You are a coding agent."
ENCRYPTED = "gAAAAB" + "Q" * 2000  # 2,006 base64 characters: at most 1,505 bytes of plaintext
HEAD_SHARES = [pytest.param(None, id="default"), pytest.param({"drop_oldest_turns": {"head_share": 0}}, id="head0")]
PROMPT = {"role": "user", "content": "Fix the failing test in the parser."}


def turns(first: int, count: int, size: int) -> list[dict[str, Any]]:
    """`count` question-and-answer turns of about `size` tokens each side (words of two tokens)."""
    out: list[dict[str, Any]] = []
    for k in range(first, first + count):
        out.append({"role": "user", "content": f"question {k}: " + words(size // 2, f"q{k}")})
        out.append(
            {
                "role": "assistant",
                "content": [{"type": "output_text", "text": f"answer {k}: " + words(size // 2, f"a{k}")}],
            }
        )
    return out


def with_item(old: int, newer: int, size: int = 1000) -> dict[str, Any]:
    items = [*turns(0, old, size), {"type": "compaction", "id": "cmp_1", "encrypted_content": ENCRYPTED}]
    items += [*turns(old, newer, size), {"role": "user", "content": "What is left to do?"}]
    return {"model": "gpt-4o", "instructions": INSTRUCTIONS, "input": items, "max_output_tokens": 1024}


def exchanges(steps: int, size: int = 1500) -> list[dict[str, Any]]:
    """Codex's items: the prompt, then `steps` shell calls, each answered by `size` words (two tokens each)."""
    items: list[dict[str, Any]] = [PROMPT]
    for k in range(steps):
        items.append({"type": "reasoning", "id": f"rs_{k}", "summary": [], "encrypted_content": "gAAAA" + "x" * 200})
        items.append({"type": "function_call", "call_id": f"c{k}", "name": "shell", "arguments": '{"cmd": "cat f"}'})
        items.append(
            {"type": "function_call_output", "call_id": f"c{k}", "output": f"out {k}: " + words(size, f"o{k}")}
        )
    return items


def tiktoken_count(body: dict[str, Any], start: int = 0) -> int:
    """What the model reads from item `start` on, by tiktoken directly (o200k): the text, a call's
    name and arguments, 4 tokens of framing an item, a compaction item at one token a byte of its
    plaintext at most: the tests' own count, not the guard's."""
    enc = encoding("gpt-4o")
    total = len(enc.encode(body.get("instructions") or ""))
    for item in body["input"][start:]:
        total += 4
        if item.get("type") == "compaction":
            total += math.ceil(len(item["encrypted_content"]) * 3 / 4)
        elif item.get("type") == "function_call":
            total += len(enc.encode(item["name"] + item["arguments"]))
        elif item.get("type") == "function_call_output":
            total += len(enc.encode(item["output"]))
        elif "content" in item:
            content = item["content"]
            parts = [{"text": content}] if isinstance(content, str) else content
            total += sum(len(enc.encode(p.get("text", ""))) for p in parts)
    return total


def outputs(body: dict[str, Any]) -> list[str]:
    return [item["output"] for item in body["input"] if item.get("type") == "function_call_output"]


class TestACompactionItem:
    def test_every_item_sent_is_counted_the_items_before_it_too(self):
        """The provider reads every item it is sent (the compact endpoint's own output puts the
        user's messages before its item): a body that fits whole goes unchanged, counted whole (the
        item at the most its ciphertext can decode to), flagged as an estimate."""
        request = with_item(old=3, newer=2)
        fitted = fit_body(ADAPTER, request, 16_000)
        whole = tiktoken_count(request)
        assert fitted.plan.result.outcome == "unchanged" and fitted.body is request
        assert whole <= fitted.plan.count.total <= 1.5 * whole
        assert not fitted.exact and not fitted.parsed.server_state
        assert any("1,505 tokens" in note for note in fitted.parsed.notes)
        assert any("6 items before it go first" in note for note in fitted.parsed.notes)

    @pytest.mark.parametrize("options", HEAD_SHARES)
    def test_over_the_window_from_the_item_on_the_items_before_it_go_before_any_after_it(self, options):
        request = with_item(old=20, newer=10, size=2000)
        fitted = fit_body(ADAPTER, request, 16_000, options=options)
        result, sent = fitted.plan.result, fitted.body
        assert result.outcome == "trimmed" and result.fits
        assert sent["input"][0] == request["input"][40]  # the compaction item, first and whole
        assert sent["input"][-1] == request["input"][-1]  # the latest turn
        assert not any(item in sent["input"] for item in request["input"][:40])
        assert tiktoken_count(sent) <= result.budget.input_budget
        assert responses_problems(sent) == []

    def test_a_reasoning_item_before_the_compaction_item_is_counted_with_what_it_precedes(self):
        request = with_item(old=2, newer=1)
        without = fit_body(ADAPTER, request, 200_000).plan.count.total
        summary = [{"type": "summary_text", "text": words(200, "thought")}]
        request["input"].insert(1, {"type": "reasoning", "id": "rs_0", "summary": summary})
        assert fit_body(ADAPTER, request, 200_000).plan.count.total > without


class TestACompactionRequest:
    def test_codex_s_compaction_trigger_is_counted_and_fitted_evenly(self):
        """Codex compacts with a Responses request whose input ends in `compaction_trigger`: over the
        window, every exchange keeps some of its output, the prompt and the trigger stay."""
        request = {
            "model": "gpt-4o",
            "instructions": INSTRUCTIONS,
            "input": [*exchanges(24), {"type": "compaction_trigger"}],
        }
        fitted = fit_body(ADAPTER, request, 32_000)
        self._fitted_as_a_compaction(fitted, request, 24)
        assert fitted.body["input"][-1] == {"type": "compaction_trigger"}

    def test_a_standalone_compaction_is_counted_and_fitted_evenly_too(self):
        request = {"model": "gpt-4o", "instructions": INSTRUCTIONS, "input": exchanges(24)}
        fitted = fit_body(ResponsesCompactAdapter(), request, 32_000)
        self._fitted_as_a_compaction(fitted, request, 24)
        assert any("compacts with" in note for note in fitted.parsed.notes)

    @staticmethod
    def _fitted_as_a_compaction(fitted: Any, request: dict[str, Any], steps: int) -> None:
        result, sent = fitted.plan.result, fitted.body
        assert result.outcome == "trimmed" and result.tokens_before > result.budget.context_window
        assert tiktoken_count(sent) <= result.budget.input_budget
        assert sent["instructions"] == INSTRUCTIONS and sent["input"][0] == PROMPT
        assert responses_problems(sent) == []
        with_material = [k for k, text in enumerate(outputs(sent)) if text.startswith(f"out {k}: o{k} o{k}")]
        assert len(with_material) >= 2 * steps / 3
        assert "clear_tool_results" in result.strategies and "drop_oldest_turns" not in result.strategies


class TestAtASmallWindow:
    def test_codex_s_fourth_call_at_16k_clears_the_oldest_result_instead_of_refusing(self):
        """~7.6k tokens of instructions, encrypted reasoning, three ~3k-token results: shrunk to their
        cap (2,000) they still overflowed and the turn failed; now the oldest is cleared."""
        request = {"model": "gpt-4o", "instructions": words(7600, "rule"), "input": exchanges(3)}
        fitted = fit_body(ADAPTER, request, 16_384)
        result, sent = fitted.plan.result, fitted.body
        assert result.outcome == "trimmed" and tiktoken_count(sent) <= result.budget.input_budget
        oldest, *newer = outputs(sent)
        assert oldest.startswith("[context-guard cleared") and all(
            t.startswith(f"out {k + 1}") for k, t in enumerate(newer)
        )
        assert sent["input"][0] == PROMPT and responses_problems(sent) == []
