"""Models as Bedrock names them: ids with versions and `:`, regional and global inference profiles,
each with the window and tokenizer of the foundation model inside; AWS's model cards over the map."""

from __future__ import annotations

import pytest

from proxy.core.models.model_registry import ModelRegistry


class TestBedrockModelNames:
    @pytest.mark.parametrize(
        ("model", "window", "tokenizer"),
        [
            ("anthropic.claude-sonnet-4-5-20250929-v1:0", 200_000, "bound:claude"),
            ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", 200_000, "bound:claude"),
            ("global.anthropic.claude-sonnet-4-5-20250929-v1:0", 200_000, "bound:claude"),
            ("us.meta.llama3-3-70b-instruct-v1:0", 128_000, "vocab:llama3"),
            ("us.meta.llama4-maverick-17b-instruct-v1:0", 1_000_000, "vocab:llama4"),
            ("mistral.mistral-large-2407-v1:0", 128_000, "vocab:mistral-v3"),
            ("eu.amazon.nova-pro-v1:0", 300_000, "bound:open"),
        ],
    )
    def test_each_is_counted_with_its_foundation_models_window_and_tokenizer(
        self, registry: ModelRegistry, model: str, window: int, tokenizer: str
    ) -> None:
        profile = registry.profile(model)
        spec = profile.tokenizer
        assert (profile.context_window, f"{spec.kind}:{spec.source}") == (window, tokenizer)

    def test_a_profile_the_map_lacks_falls_back_to_its_foundation_model(self, registry: ModelRegistry) -> None:
        """The map has `amazon.nova-premier-v1:0` and no `us.` profile of it (a 8,192 fallback before)."""
        assert registry.profile("us.amazon.nova-premier-v1:0").context_window == 1_000_000

    def test_the_model_card_corrects_nova_premiers_output_limit(self, registry: ModelRegistry) -> None:
        assert registry.profile("us.amazon.nova-premier-v1:0").max_output_tokens == 25_000
