"""Degrade before refusing: when the prompt and the newest tool exchanges cannot all fit, fewer of
them are kept whole, down to the newest one, which is shortened only as the last resort; a request
is refused only when the fixed parts and the newest exchange alone cannot fit."""

from __future__ import annotations

from typing import Any

from proxy.core.trimming.turns import validity_problems
from tests.support.cookbook import cookbook_count
from tests.support.trimming import fit, words

PROMPT = "Fix the failing test in the parser."


def agent(instructions: int, results: list[int], history: bool = False) -> dict[str, Any]:
    """An agent's request as Codex sends one: `instructions` tokens of instructions, (an earlier
    turn,) the prompt, then one `shell` call per entry of `results`, answered by that many words
    (two tokens each)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": words(instructions, "rule")}]
    if history:
        messages += [
            {"role": "user", "content": "Read the README first."},
            {"role": "assistant", "content": "Read it: " + words(800, "readme")},
        ]
    messages.append({"role": "user", "content": PROMPT})
    for k, size in enumerate(results):
        call = {"id": f"c{k}", "type": "function", "function": {"name": "shell", "arguments": '{"cmd": "cat f"}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{k}", "content": f"out {k}: " + words(size, f"o{k}")})
    return {"model": "gpt-4o", "messages": messages}


def results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "tool"]


class TestTheNewestExchangesDegrade:
    def test_codex_at_a_16k_window_clears_the_oldest_result_instead_of_refusing(self):
        """7.6k tokens of instructions and three ~3k-token results: shrunk to their cap they still
        overflowed (13,670 > 13,107: refused); clearing the oldest of the three makes the room."""
        body = agent(7600, [1500, 1500, 1500])
        result = fit(body, 16_384).result
        sent = result.body
        assert result.outcome == "trimmed" and result.fits
        assert cookbook_count(sent) <= result.budget.input_budget
        assert validity_problems(sent["messages"]) == []
        oldest, *newer = results(sent)
        assert oldest.startswith("[context-guard cleared the output of shell")
        assert all(text.startswith(f"out {k + 1}: o{k + 1}") for k, text in enumerate(newer))
        assert sent["messages"][:2] == body["messages"][:2]  # the instructions and the prompt whole
        removals = {r.index: r for r in result.removals}
        assert removals[3].kind == "cleared" and removals[3].strategy == "drop_recent_turns"
        assert "drop_recent_turns" in result.strategies

    def test_the_oldest_go_first_and_the_newest_is_kept_while_anything_older_is_left(self):
        body = agent(7600, [1500] * 6)
        result = fit(body, 16_384).result
        kept = results(result.body)
        assert result.fits and kept[-2].startswith("out 4: o4") and kept[-1].startswith("out 5: o5")
        assert all(text.startswith("[context-guard cleared") for text in kept[:-2])

    def test_the_newest_result_is_shortened_only_as_the_last_resort(self):
        """11.5k tokens of instructions leave about 1.5k: the newest 6k-token result is cut below its
        cap (2,000) to fit, after the older ones were cleared, and nothing is refused."""
        body = agent(11_500, [1000, 1000, 3000])
        result = fit(body, 16_384).result
        kept = results(result.body)
        assert result.outcome == "trimmed" and cookbook_count(result.body) <= result.budget.input_budget
        assert all(text.startswith("[context-guard cleared") for text in kept[:-1])
        assert kept[-1].startswith("out 2: o2") and "tokens removed" in kept[-1]
        assert {r.index: r.tokens for r in result.removals}[7] > 4000  # 6,000 down to under 2,000

    def test_with_an_earlier_turn_too_the_request_fits_and_keeps_the_prompt_and_the_newest_result(self):
        body = agent(7600, [1500, 1500, 1500], history=True)
        result = fit(body, 16_384).result
        sent = result.body["messages"]
        assert result.outcome == "trimmed" and cookbook_count(result.body) <= result.budget.input_budget
        assert validity_problems(sent) == [] and {"role": "user", "content": PROMPT} in sent
        assert results(result.body)[-1].startswith("out 2: o2")

    def test_only_what_cannot_be_cut_and_the_newest_exchange_alone_are_refused(self):
        """Instructions over the budget by themselves: no exchange can make the room."""
        result = fit(agent(13_500, [1000, 1000]), 16_384).result
        assert result.outcome == "rejected"
