"""Model profiles: windows from the model map, names normalised, overrides and fallbacks."""

from __future__ import annotations

import pytest

from proxy.core.models import model_registry
from proxy.core.models.model_registry import ModelOverride, ModelRegistry, TokenizerSpec, name_candidates


class TestNameResolution:
    @pytest.mark.parametrize(
        ("name", "window"),
        [
            ("gpt-4o", 128000),
            ("openai/gpt-4o", 128000),
            ("gpt-4o-2024-08-06", 128000),
            ("GPT-4o", 128000),
            ("gpt-4", 8192),
            ("google/gemini-2.5-pro", 1048576),
            ("vertex_ai/gemini-2.5-pro", 1048576),
            ("gemini-2.5-pro", 1048576),
        ],
    )
    def test_resolves_provider_prefixes_and_snapshots(self, registry, name, window):
        profile = registry.profile(name)
        assert profile.known and profile.context_window == window

    def test_a_bare_name_listed_only_under_providers_takes_the_smallest_window(self, model_map):
        registry = ModelRegistry(
            {
                "a/foo-1": {"max_input_tokens": 32000, "mode": "chat"},
                "b/foo-1": {"max_input_tokens": 8000, "mode": "chat"},
            }
        )
        assert registry.profile("foo-1").context_window == 8000

    def test_a_fine_tune_resolves_to_its_base_model(self, registry):
        tuned = registry.profile("ft:gpt-4o-mini-2024-07-18:my-org::abc123")
        base = registry.profile("gpt-4o-mini")
        assert tuned.context_window == base.context_window and tuned.window_source == "model_map"
        assert tuned.tokenizer == base.tokenizer and str(tuned.tokenizer).startswith("tiktoken:o200k_base")

    def test_date_suffix_candidates(self):
        assert "claude-3-opus" in name_candidates("vertex_ai/claude-3-opus@20240229")
        assert "gpt-4o" in name_candidates("gpt-4o-2024-08-06")


class TestTokenizerChoice:
    @pytest.mark.parametrize(
        ("name", "encoding"),
        [
            ("gpt-4o", "o200k_base"),
            ("gpt-4.1-mini", "o200k_base"),
            ("gpt-5", "o200k_base"),
            ("o3-mini", "o200k_base"),
            ("gpt-4", "cl100k_base"),
            ("gpt-3.5-turbo", "cl100k_base"),
            ("gpt-4-turbo", "cl100k_base"),
        ],
    )
    def test_openai_models_use_their_own_encoding_exactly(self, registry, name, encoding):
        profile = registry.profile(name)
        assert profile.tokenizer == TokenizerSpec("tiktoken", encoding) and profile.tokenizer_exact

    @pytest.mark.parametrize("name", ["claude-sonnet-4-5", "gemini-exp-1206", "gemma-3n-e4b-it", "llama-2-7b-chat"])
    def test_families_whose_tokenizer_does_not_ship_get_a_bound(self, registry, name):
        profile = registry.profile(name)
        assert not profile.tokenizer_exact and profile.tokenizer.kind == "bound"

    @pytest.mark.parametrize(
        ("name", "vocabulary"),
        [
            ("llama-3.1-70b", "llama3"),
            ("mistral-large", "tekken"),
            ("qwen2.5-72b", "qwen"),
            ("deepseek-chat", "deepseek-v3"),
            ("gemma-3-27b-it", "gemma3"),
        ],
    )
    def test_open_families_get_their_own_vocabulary(self, registry, name, vocabulary):
        profile = registry.profile(name)
        assert profile.tokenizer_exact and profile.tokenizer == TokenizerSpec("vocab", vocabulary)


class TestFallbackAndOverrides:
    def test_an_unknown_model_gets_the_configured_conservative_window_and_is_flagged(self, model_map):
        profile = ModelRegistry(model_map, fallback_window=4096).profile("my-private-model")
        assert profile.context_window == 4096 and not profile.known and profile.window_source == "fallback"

    def test_an_override_sets_window_output_and_tokenizer_by_glob(self, model_map):
        override = ModelOverride(
            "my-llama-*",
            context_window=32768,
            max_output_tokens=2048,
            tokenizer=TokenizerSpec("tiktoken", "cl100k_base", 1.1),
        )
        profile = ModelRegistry(model_map, overrides=(override,)).profile("my-llama-8b")
        assert (profile.context_window, profile.max_output_tokens, profile.window_source) == (32768, 2048, "config")
        assert profile.tokenizer.multiplier == 1.1

    def test_an_alias_counts_as_its_target(self, model_map):
        registry = ModelRegistry(model_map, overrides=(ModelOverride("team-default", alias_of="gpt-4"),))
        profile = registry.profile("team-default")
        assert (
            profile.name == "team-default"
            and profile.context_window == 8192
            and profile.tokenizer.source == "cl100k_base"
        )


class TestTokenizerSpec:
    @pytest.mark.parametrize(
        ("text", "spec"),
        [
            ("tiktoken:o200k_base", TokenizerSpec("tiktoken", "o200k_base")),
            ("tiktoken:cl100k_base*1.45", TokenizerSpec("tiktoken", "cl100k_base", 1.45)),
            ("huggingface:/m/tokenizer.json", TokenizerSpec("huggingface", "/m/tokenizer.json")),
            ("estimate:3.5", TokenizerSpec("estimate", "3.5")),
            ("estimate:3:bytes", TokenizerSpec("estimate", "3:bytes")),
        ],
    )
    def test_parses(self, text, spec):
        assert TokenizerSpec.parse(text) == spec

    @pytest.mark.parametrize(
        "text", ["sentencepiece:x", "tiktoken:", "tiktoken:o200k_base*0.8", "estimate:abc", "estimate:3:words"]
    )
    def test_rejects(self, text):
        with pytest.raises(ValueError):
            TokenizerSpec.parse(text)


class TestTheProfileCache:
    def test_past_its_bound_a_new_name_is_kept_and_the_oldest_goes(self, model_map, monkeypatch):
        """Clients name what they like: once `CACHED_NAMES` names are kept, each new one still is
        (resolved once, not at every lookup), and the cache stays at its bound."""
        registry = ModelRegistry(model_map)
        for i in range(model_registry.CACHED_NAMES + 10):
            registry.profile(f"gpt-4o-custom-{i}")
        resolved: list[str] = []
        resolve = ModelRegistry._resolve

        def counted(self: ModelRegistry, name: str, depth: int) -> object:
            resolved.append(name)
            return resolve(self, name, depth)

        monkeypatch.setattr(ModelRegistry, "_resolve", counted)
        for _ in range(3):
            assert registry.profile("gpt-4o-first-seen-now").name == "gpt-4o-first-seen-now"
        assert resolved == ["gpt-4o-first-seen-now"]
        assert len(registry._cache) == model_registry.CACHED_NAMES and "gpt-4o-custom-0" not in registry._cache
