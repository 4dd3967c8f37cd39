"""Legacy completions: one prompt, counted without chat framing, cut middle-out or refused."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.apis.base import InvalidRequest
from proxy.apis.openai.completions import CompletionsAdapter, CompletionsOptions
from tests.apis.fitting import fit_body, words
from tests.support.trimming import tokenizer

ADAPTER = CompletionsAdapter()


def body(prompt: Any, **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-3.5-turbo-instruct", "prompt": prompt, **fields}


class TestCount:
    def test_a_prompt_counts_its_tokens_and_nothing_more_on_openais_models(self) -> None:
        """OpenAI's legacy completions charge the prompt's tokens: no role, no framing, no BOS."""
        prompt = "Once upon a time, in a land far away,"
        count = fit_body(ADAPTER, body(prompt), 4096).plan.count
        assert count.total == tokenizer().count(prompt) and count.components["reply_priming"] == 0

    def test_a_suffix_is_counted(self) -> None:
        plain = fit_body(ADAPTER, body("def f():"), 4096).plan.count.total
        with_suffix = fit_body(ADAPTER, body("def f():", suffix="    return 1"), 4096).plan.count.total
        assert with_suffix > plain

    def test_token_id_prompts_count_by_their_number(self) -> None:
        assert fit_body(ADAPTER, body([1, 2, 3, 4, 5]), 4096).plan.count.total == 5

    def test_the_api_default_of_16_output_tokens_is_the_reserve(self) -> None:
        assert fit_body(ADAPTER, body("hi"), 4096).plan.result.budget.output_reserve == 16

    def test_a_batch_is_counted_by_its_longest_prompt(self) -> None:
        long = words(300)
        assert fit_body(ADAPTER, body(["short", long]), 4096).plan.count.total == tokenizer().count(long)

    def test_a_batch_is_counted_by_the_prompt_of_the_most_tokens_not_of_the_most_characters(self) -> None:
        ascii_prompt = "a" * 1200
        cjk_prompt = "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(900))  # fewer characters
        assert tokenizer().count(cjk_prompt) > 2 * tokenizer().count(ascii_prompt)
        total = fit_body(ADAPTER, body([ascii_prompt, cjk_prompt]), 4096).plan.count.total
        assert total == tokenizer().count(cjk_prompt)


class TestOverBudget:
    def test_a_long_prompt_is_cut_in_the_middle_keeping_its_head_and_tail(self) -> None:
        prompt = "INSTRUCTIONS. " + words(5000) + " THE END"
        fitted = fit_body(ADAPTER, body(prompt, max_tokens=100, temperature=0), 2000)
        cut = fitted.body["prompt"]
        assert cut.startswith("INSTRUCTIONS.") and cut.endswith("THE END") and "tokens removed" in cut
        assert fitted.plan.result.fits and fitted.body["temperature"] == 0

    def test_a_one_prompt_list_stays_a_list(self) -> None:
        fitted = fit_body(ADAPTER, body([words(5000)]), 2000)
        assert isinstance(fitted.body["prompt"], list) and "tokens removed" in fitted.body["prompt"][0]

    def test_with_overflow_reject_a_long_prompt_is_refused(self) -> None:
        adapter = CompletionsAdapter(CompletionsOptions(overflow="reject"))
        assert fit_body(adapter, body(words(5000)), 2000).plan.result.outcome == "rejected"

    def test_a_batch_over_budget_is_refused_not_cut(self) -> None:
        assert fit_body(ADAPTER, body(["a", words(5000)]), 2000).plan.result.outcome == "rejected"

    def test_a_prompt_that_fits_is_forwarded_as_the_very_body_received(self) -> None:
        sent = body("hello")
        assert fit_body(ADAPTER, sent, 4096).body is sent


class TestParse:
    @pytest.mark.parametrize("prompt", [5, [], ["a", 1], {"text": "x"}])
    def test_a_malformed_prompt_is_refused_naming_the_field(self, prompt: Any) -> None:
        with pytest.raises(InvalidRequest) as error:
            ADAPTER.parse(body(prompt))
        assert error.value.param == "prompt"

    def test_a_missing_prompt_is_the_empty_prompt(self) -> None:
        assert ADAPTER.parse({"model": "m"}).messages[0]["content"] == ""


class TestOptions:
    @pytest.mark.parametrize(
        ("options", "message"), [({"overflow": "truncate"}, "cut or reject"), ({"min_prompt_tokens": -1}, ">= 0")]
    )
    def test_a_bad_option_is_refused_with_its_key(self, options: dict[str, Any], message: str) -> None:
        with pytest.raises(ValueError, match=message):
            CompletionsOptions(**options)
