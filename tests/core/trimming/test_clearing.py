"""`clear_tool_results`: old tool results cleared in cache-stable blocks, old exchanges dropped
whole, the newest results and the prompt kept; a compaction request shortened evenly instead."""

from __future__ import annotations

import itertools
import re
from typing import Any

import pytest

from proxy.config.settings import settings_from_dict
from proxy.core.trimming.clearing import ClearToolResults, placeholder
from proxy.core.trimming.strategies import build_pipeline
from proxy.core.trimming.turns import validity_problems
from proxy.errors import ConfigError
from tests.support.trimming import fit, words


def loop(steps: int, result_words: int = 500, prompt: str = "Find the bug in the parser.") -> list[dict[str, Any]]:
    """One prompt, then `steps` calls of `read_file`, each answered by `result_words` words (two
    tokens each: about 1,000 tokens by default)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an agent."},
        {"role": "user", "content": prompt},
    ]
    for k in range(steps):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "read_file", "arguments": f'{{"n": {k}}}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append(
            {"role": "tool", "tool_call_id": f"c{k}", "content": f"file {k}: " + words(result_words, f"w{k}")}
        )
    return messages


def body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": messages, "max_tokens": 500}


def cleared(messages: list[dict[str, Any]]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in messages if m["role"] == "tool" and m["content"].startswith("[")}


class TestClearToolResults:
    def test_a_loop_over_budget_keeps_every_call_the_prompt_and_the_newest_results(self):
        messages = loop(20)
        result = fit(body(messages), 12_000).result
        sent = result.body["messages"]
        assert result.outcome == "trimmed" and result.strategies == ("clear_tool_results",)
        assert len(sent) == len(messages) and sent[:2] == messages[:2]
        assert sent[-6:] == messages[-6:]  # the newest three exchanges verbatim
        assert validity_problems(sent) == []
        assert {r.kind for r in result.removals} == {"cleared"} and result.fits

    def test_the_placeholder_names_the_tool_the_tokens_and_how_to_get_them_back(self):
        sent = fit(body(loop(20)), 12_000).result.body["messages"]
        first = cleared(sent)["c0"]
        tokens = int(re.search(r"\(([\d,]+) tokens\)", first).group(1).replace(",", ""))  # type: ignore[union-attr]
        assert 1_000 <= tokens <= 1_020 and first == placeholder("read_file", tokens)
        assert "read_file" in first and "calling the tool again returns it" in first

    def test_the_next_requests_clear_the_same_results_with_the_same_bytes_until_the_budget_is_full_again(self):
        """Appending a step re-sends every cleared result as it was: the prefix holds."""
        runs = [cleared(fit(body(loop(n)), 12_000).result.body["messages"]) for n in range(12, 30)]
        moves = 0
        for before, after in itertools.pairwise(runs):
            assert all(after[k] == v for k, v in before.items())  # once cleared, the same bytes
            moves += len(after) != len(before)
        assert moves <= len(runs) // 3  # most steps append to an unchanged prefix

    def test_each_clearing_frees_at_least_clear_at_least_tokens(self):
        options = {"clear_tool_results": {"clear_at_least": 5_000, "step_share": 0.01}}
        counts = [
            len(cleared(fit(body(loop(n)), 12_000, options=options).result.body["messages"])) for n in range(12, 30)
        ]
        increases = [b - a for a, b in itertools.pairwise(counts) if b != a]
        assert increases and all(step >= 4 for step in increases)  # ~1,000-token results, 5,000 at a time

    def test_a_request_that_fits_is_left_alone(self):
        request = body(loop(3))
        assert fit(request, 128_000).result.body is request

    def test_when_clearing_is_not_enough_old_exchanges_go_whole_and_the_newest_stay(self):
        messages = loop(60, result_words=150)
        result = fit(body(messages), 3_000).result
        sent = result.body["messages"]
        assert result.fits and validity_problems(sent) == []
        assert sent[:2] == messages[:2] and sent[-6:] == messages[-6:]
        assert "dropped" in {r.kind for r in result.removals}
        assert all(r.index is not None and r.index >= 2 for r in result.removals)

    def test_user_and_assistant_messages_of_earlier_turns_stay_while_their_tool_output_goes(self):
        messages = loop(10)
        later = [{"role": "assistant", "content": "The parser is fine."}, {"role": "user", "content": "Now the lexer."}]
        messages += later + loop(10)[2:]
        sent = fit(body(messages), 12_000).result.body["messages"]
        assert [m for m in sent if m["role"] in ("user", "assistant") and m.get("content")] == [
            m for m in messages if m["role"] in ("user", "assistant") and m.get("content")
        ]

    @pytest.mark.parametrize(
        "options",
        [{"keep_last": -1}, {"step_share": 0}, {"clear_at_least": 0}, {"compaction_patterns": ["("]}],
    )
    def test_a_bad_option_is_refused_naming_it(self, options):
        with pytest.raises(ValueError, match=next(iter(options)).split("_")[0]):
            ClearToolResults(**options)


class TestACompactionRequest:
    def test_its_results_are_shortened_evenly_and_its_opening_kept(self):
        messages = [*loop(20), {"role": "assistant", "content": "Done reading."}]
        messages.append({"role": "user", "content": "Summarize the conversation so far for a handoff."})
        result = fit(body(messages), 12_000).result
        sent = result.body["messages"]
        assert result.fits and sent[:2] == messages[:2] and sent[-1] == messages[-1]
        shortened = [m["content"] for m in sent if m["role"] == "tool"]
        assert len(shortened) == 20 and all("tokens removed" in text for text in shortened)
        assert all(text.startswith(f"file {k}: w{k}") for k, text in enumerate(shortened))
        assert result.tokens_after >= 0.85 * result.budget.input_budget

    def test_an_operators_own_pattern_is_recognised(self):
        messages = [*loop(20), {"role": "user", "content": "Write the checkpoint now."}]
        options = {"clear_tool_results": {"compaction_patterns": [r"write the checkpoint"]}}
        sent = fit(body(messages), 12_000, options=options).result.body["messages"]
        assert not cleared(sent) and all("tokens removed" in m["content"] for m in sent if m["role"] == "tool")


class TestFromTheSettings:
    def test_the_trim_sections_options_reach_the_strategy(self):
        options = {"clear_tool_results": {"compaction_patterns": ["write the checkpoint"], "keep_last": 5}}
        settings = settings_from_dict({"trim": {"options": options}}, "t.yaml", {})
        strategy = build_pipeline(settings.trim.pipeline, settings.trim.options)[0]
        assert strategy == ClearToolResults(keep_last=5, compaction_patterns=("write the checkpoint",))

    def test_a_bad_pattern_is_a_config_error_naming_the_strategy_and_the_pattern(self):
        options = {"clear_tool_results": {"compaction_patterns": ["("]}}
        with pytest.raises(ConfigError, match=r"clear_tool_results: compaction pattern '\('"):
            settings_from_dict({"trim": {"options": options}}, "t.yaml", {})
