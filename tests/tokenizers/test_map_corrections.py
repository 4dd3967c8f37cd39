"""The model map corrected from the providers' documentation."""

from __future__ import annotations

import re

from proxy.core.models.model_registry import ModelRegistry
from proxy.tokenizers.map_corrections import MAP_CORRECTIONS, corrected, correction_for
from proxy.tokenizers.model_map import load_model_map


class TestTheTable:
    def test_every_entry_names_a_provider_page_and_the_date_it_was_read(self):
        for correction in MAP_CORRECTIONS:
            assert correction.source.startswith(
                ("https://developers.openai.com/", "https://docs.anthropic.com/", "https://platform.claude.com/",
                 "https://docs.aws.amazon.com/bedrock/")
            )
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", correction.checked)

    def test_gpt_3_5_turbo_instruct_has_the_4096_token_window_openai_documents(self):
        registry = ModelRegistry(load_model_map())
        for name in ("gpt-3.5-turbo-instruct", "gpt-3.5-turbo-instruct-0914", "openai/gpt-3.5-turbo-instruct"):
            profile = registry.profile(name)
            assert (profile.context_window, profile.max_output_tokens) == (4096, 4096), name

    def test_current_models_have_the_windows_their_providers_document(self):
        registry = ModelRegistry(load_model_map())
        assert registry.profile("claude-sonnet-4-6").context_window == 1_000_000
        assert registry.profile("gpt-5.5").context_window == 1_050_000

    def test_a_map_that_gives_claude_sonnet_4_6_the_64k_output_of_litellm_1_93_is_corrected(self):
        entry = {"mode": "chat", "max_input_tokens": 1_000_000, "max_tokens": 64_000, "max_output_tokens": 64_000}
        model_map, applied = corrected({"claude-sonnet-4-6": entry})
        assert model_map["claude-sonnet-4-6"]["max_output_tokens"] == 128_000
        assert [c.key for c in applied] == ["claude-sonnet-4-6"]

    def test_models_the_table_does_not_name_keep_the_map_s_window(self):
        registry = ModelRegistry(load_model_map())
        assert registry.profile("gpt-4o").context_window == 128000
        assert correction_for(registry.profile("gpt-4o")) is None


class TestCorrected:
    def test_an_entry_that_agrees_with_the_provider_is_left_as_it_is(self):
        entry = {"mode": "completion", "max_input_tokens": 4096, "max_tokens": 4096, "max_output_tokens": 4096}
        model_map, applied = corrected({"gpt-3.5-turbo-instruct": entry})
        assert model_map["gpt-3.5-turbo-instruct"] is entry and applied == ()

    def test_a_disagreeing_entry_is_replaced_not_edited_in_place(self):
        """The loader shares equal entries between models: editing one would edit them all."""
        entry = {"mode": "completion", "max_input_tokens": 8192, "max_tokens": 4096, "max_output_tokens": 4096}
        model_map, applied = corrected({"gpt-3.5-turbo-instruct": entry, "other": entry})
        assert model_map["gpt-3.5-turbo-instruct"]["max_input_tokens"] == 4096
        assert entry["max_input_tokens"] == 8192 and model_map["other"] is entry
        assert [c.key for c in applied] == ["gpt-3.5-turbo-instruct"]

    def test_the_log_field_names_the_entry_and_its_source(self):
        profile = ModelRegistry(load_model_map()).profile("gpt-3.5-turbo-instruct")
        field = correction_for(profile)
        assert field is not None and field["entry"] == "gpt-3.5-turbo-instruct" and field["context_window"] == 4096
        assert field["source"].endswith("/models/gpt-3.5-turbo-instruct")
