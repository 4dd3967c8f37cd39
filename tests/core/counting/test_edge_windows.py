"""Which window an open model takes: the host's entry for a host's name, the model's own otherwise."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.models.model_registry import ModelRegistry
from proxy.core.models.open_windows import DOCUMENTED_WINDOWS, documented_window
from proxy.tokenizers.model_map import load_model_map

MAP: dict[str, dict[str, Any]] = {
    "novita/meta-llama/llama-3.1-8b-instruct": {"mode": "chat", "max_input_tokens": 16384},
    "deepinfra/meta-llama/Meta-Llama-3.1-8B-Instruct": {"mode": "chat", "max_input_tokens": 131072},
    "together_ai/meta-llama/Llama-3.1-8B-Instruct": {"mode": "chat", "max_input_tokens": 65536},
    "groq/llama-3.1-8b-instant": {"mode": "chat", "max_input_tokens": 131072},
    "hyperbolic/Qwen/Qwen2.5-72B-Instruct": {"mode": "chat", "max_input_tokens": 131072},
    "mistral/mistral-large-latest": {"mode": "chat", "max_input_tokens": 128000},
    "somehost/mistral-large-latest": {"mode": "chat", "max_input_tokens": 32000},
    "gpt-4o": {"mode": "chat", "max_input_tokens": 128000},
    "vertex_ai/claude-3-5-sonnet@20240620": {"mode": "chat", "max_input_tokens": 200000},
    "a/rare-model": {"mode": "chat", "max_input_tokens": 9000},
    "b/rare-model": {"mode": "chat", "max_input_tokens": 7000},
}


@pytest.fixture
def registry() -> ModelRegistry:
    return ModelRegistry(MAP)


class TestOpenModelWindows:
    @pytest.mark.parametrize(
        "name", ["meta-llama/Llama-3.1-8B-Instruct", "Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct"]
    )
    def test_a_name_without_a_host_takes_the_models_documented_window(self, registry: ModelRegistry, name: str) -> None:
        """Novita's 16,384 is how Novita serves it; the model's own window is 128k."""
        profile = registry.profile(name)
        assert (profile.context_window, profile.window_source) == (131072, "model_card")
        assert profile.matched is not None and "huggingface.co/meta-llama" in profile.matched

    def test_a_hosts_name_takes_that_hosts_entry(self, registry: ModelRegistry) -> None:
        assert registry.profile("novita/meta-llama/llama-3.1-8b-instruct").context_window == 16384
        assert registry.profile("together_ai/meta-llama/Llama-3.1-8B-Instruct").context_window == 65536
        assert registry.profile("groq/llama-3.1-8b-instant").matched == "groq/llama-3.1-8b-instant"

    def test_a_hosts_name_is_matched_case_insensitively(self, registry: ModelRegistry) -> None:
        assert registry.profile("NOVITA/Meta-Llama/Llama-3.1-8B-Instruct").context_window == 16384

    def test_a_host_without_an_entry_for_the_model_gives_the_documented_window_not_another_hosts(
        self, registry: ModelRegistry
    ) -> None:
        profile = registry.profile("groq/meta-llama/Llama-3.1-8B-Instruct")
        assert (profile.context_window, profile.window_source) == (131072, "model_card")

    def test_qwen_takes_its_default_config_window_not_a_hosts_yarn_one(self, registry: ModelRegistry) -> None:
        """Qwen2.5 runs with 32,768 unless YaRN is switched on; Hyperbolic's entry says 131,072."""
        assert registry.profile("Qwen/Qwen2.5-72B-Instruct").context_window == 32768
        assert registry.profile("hyperbolic/Qwen/Qwen2.5-72B-Instruct").context_window == 131072

    def test_a_model_the_table_does_not_know_takes_its_makers_own_entry(self, registry: ModelRegistry) -> None:
        assert registry.profile("mistralai/mistral-large-latest").matched == "mistral/mistral-large-latest"

    def test_a_name_known_only_to_other_hosts_takes_the_smallest_of_their_windows(
        self, registry: ModelRegistry
    ) -> None:
        assert registry.profile("rare-model").context_window == 7000

    def test_closed_models_keep_their_own_entries(self, registry: ModelRegistry) -> None:
        assert registry.profile("gpt-4o").matched == "gpt-4o"
        assert registry.profile("claude-3-5-sonnet-20240620").context_window == 200000


class TestDocumentedWindows:
    @pytest.mark.parametrize(
        ("model", "window"),
        [
            ("llama-3.1-70b-instruct", 131072),
            ("meta-llama-3.1-8b-instruct", 131072),
            ("meta-llama-3-8b-instruct", 8192),
            ("llama-2-7b-chat-hf", 4096),
            ("mistral-7b-instruct-v0.1", 8192),
            ("mistral-7b-instruct-v0.3", 32768),
            ("gemma-3-27b-it", 131072),
            ("gemma-3-1b-it", 32768),
            ("qwen3-8b", 32768),
            ("qwen3-235b-a22b-instruct-2507", 262144),
        ],
    )
    def test_each_family_has_its_makers_window(self, model: str, window: int) -> None:
        found = documented_window(model)
        assert found is not None and found[0] == window

    def test_every_entry_names_its_source(self) -> None:
        assert all(source and window > 0 for _, window, source in DOCUMENTED_WINDOWS)


class TestBundledMap:
    def test_llama_3_1_8b_has_its_own_window_not_one_hosts_16k(self) -> None:
        """On litellm's bundled map, a host's smaller window stays that host's entry's."""
        registry = ModelRegistry(load_model_map())
        assert registry.profile("meta-llama/Llama-3.1-8B-Instruct").context_window == 131072
        assert registry.profile("novita/meta-llama/llama-3.1-8b-instruct").context_window == 16384
