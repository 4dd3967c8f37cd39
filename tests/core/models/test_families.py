"""A model's family, and so its tokenizer and template framing, is picked from its normalised name:
lower-cased, organisation and provider prefixes understood, never another family's through the
organisation's name."""

from __future__ import annotations

import pytest

from proxy.core.models.families import TokenizerSpec
from proxy.core.models.model_registry import family_for, family_names


def vocab(name: str) -> TokenizerSpec:
    return TokenizerSpec("vocab", name)


BOUND = TokenizerSpec("bound", "open")


class TestFamilyByName:
    @pytest.mark.parametrize(
        ("name", "tokenizer"),
        [
            ("meta-llama/Llama-3.1-8B-Instruct", vocab("llama3")),
            ("meta-llama/Meta-Llama-3-8B-Instruct", vocab("llama3")),
            ("together_ai/meta-llama/Meta-Llama-3.1-70B-Instruct-Turbo", vocab("llama3")),
            ("groq/llama-3.3-70b-versatile", vocab("llama3")),
            ("bedrock/us.meta.llama3-1-70b-instruct-v1:0", vocab("llama3")),
            ("fireworks_ai/accounts/fireworks/models/llama-v3p1-8b-instruct", vocab("llama3")),
            ("openrouter/meta-llama/llama-4-maverick", vocab("llama4")),
            ("meta-llama/Llama-4-Scout-17B-16E-Instruct", vocab("llama4")),
            ("meta-llama/Llama-2-7b-chat-hf", BOUND),
            ("codellama-34b-instruct", BOUND),
            ("Qwen/Qwen2.5-72B-Instruct", vocab("qwen")),
            ("qwen-max", vocab("qwen")),
            ("Qwen/Qwen3-235B-A22B", vocab("qwen")),
            ("openrouter/qwen/qwen3.6-27b", vocab("qwen3.5")),
            ("Qwen/QwQ-32B", vocab("qwen")),
            ("mistralai/Mistral-7B-Instruct-v0.1", vocab("mistral-v1")),
            ("mistralai/Mixtral-8x7B-Instruct-v0.1", vocab("mistral-v1")),
            ("mistralai/Mistral-7B-Instruct-v0.3", vocab("mistral-v3")),
            ("mistral-large-2407", vocab("mistral-v3")),
            ("mistral-large-2411", vocab("mistral-v7")),
            ("mistralai/Mistral-Nemo-Instruct-2407", vocab("tekken")),
            ("mistral/mistral-small-latest", vocab("tekken")),
            ("codestral-latest", vocab("tekken")),
            ("deepseek-ai/DeepSeek-V3.1", vocab("deepseek-v3")),
            ("deepseek-chat", vocab("deepseek-v3")),
            ("deepseek-ai/DeepSeek-R1-Distill-Llama-8B", vocab("llama3")),
            ("deepseek-ai/deepseek-llm-67b-chat", BOUND),
            ("vertex_ai/gemini-2.5-pro", vocab("gemma3")),
            ("google/gemma-3-27b-it", vocab("gemma3")),
            ("vertex_ai/gemini-exp-1206", BOUND),
            ("anthropic/claude-sonnet-4-5", TokenizerSpec("bound", "claude")),
            ("my-private-model", BOUND),
        ],
    )
    def test_picks_the_family_from_the_model_not_its_organisation(self, name, tokenizer):
        assert family_for(name).tokenizer == tokenizer

    def test_normalises_case_and_prefixes(self):
        assert family_names("openrouter/mistralai/Mistral-7B-Instruct-v0.1") == ["mistral-7b-instruct-v0.1"]

    @pytest.mark.parametrize(
        ("name", "default_system"),
        [("meta-llama/Llama-3.1-8B-Instruct", 25), ("meta-llama/Meta-Llama-3-8B-Instruct", 0), ("Qwen/Qwen2.5-7B-Instruct", 21), ("Qwen/Qwen3-8B", 0)],
    )
    def test_templates_that_write_a_default_system_turn_carry_it(self, name, default_system):
        assert family_for(name).chat_format.default_system == default_system


class TestTheCountNamesItsTokenizer:
    @pytest.mark.parametrize(
        ("model", "tokenizer", "exact"),
        [
            ("meta-llama/Llama-3.1-8B-Instruct", "llama3", True),
            ("mistralai/Mistral-Nemo-Instruct-2407", "tekken", True),
            ("claude-sonnet-4-5", "cl100k_base+bound:claude", False),
            ("my-private-model", "cl100k_base+bound:open", False),
        ],
    )
    def test_the_request_count_says_which_tokenizer_counted(self, counter_for, model, tokenizer, exact):
        count = counter_for(model).request({"model": model, "messages": [{"role": "user", "content": "Hi"}]})
        estimated = any("errs high" in note for note in count.notes)
        assert (count.tokenizer, estimated) == (tokenizer, not exact)
        assert exact or not count.exact  # a bound is never reported exact
