"""Which vocabularies a serving process loads before it is ready (`tokenizers.preload`,
proxy/tokenizers/at_start.py): what the upstreams' kinds can serve, every family's, or the models
named besides; the bound's base (cl100k_base, which counts every unknown name) in every case."""

from __future__ import annotations

from proxy.core.models.families import UNKNOWN_FAMILY
from proxy.core.models.model_registry import ModelRegistry, TokenizerSpec
from proxy.providers.kinds import provider_for
from proxy.tokenizers.at_start import every_family, vocabularies_at_start

O200K, CL100K = TokenizerSpec("tiktoken", "o200k_base"), TokenizerSpec("tiktoken", "cl100k_base")
REGISTRY = ModelRegistry({})


def at_start(preload: str | tuple[str, ...], *kinds: str) -> set[TokenizerSpec]:
    return set(
        vocabularies_at_start(
            preload, [provider_for(kind) for kind in kinds], lambda model: REGISTRY.profile(model).tokenizer
        )
    )


class TestAuto:
    def test_an_openai_upstream_loads_openais_encodings_and_the_bounds_base(self):
        assert at_start("auto", "openai") == {O200K, CL100K, UNKNOWN_FAMILY.tokenizer}

    def test_an_anthropic_upstream_loads_no_openai_encoding_it_cannot_serve(self):
        specs = at_start("auto", "anthropic")
        assert O200K not in specs and {spec.kind for spec in specs} == {"bound"}

    def test_a_gemini_upstream_loads_gemmas_three_vocabularies(self):
        names = {spec.source for spec in at_start("auto", "gemini") if spec.kind == "vocab"}
        assert names == {"gemma", "gemma3", "gemma4"}

    def test_a_kind_whose_models_the_config_cannot_tell_loads_openais_encodings(self):
        assert at_start("auto", "generic") == at_start("auto", "openai")

    def test_a_bedrock_upstream_loads_what_claude_and_the_open_models_are_counted_with(self):
        specs = at_start("auto", "bedrock")
        for model in ("anthropic.claude-sonnet-4-5-20250929-v1:0", "us.anthropic.claude-haiku-4-5-20251001-v1:0",
                      "amazon.nova-pro-v1:0"):  # fmt: skip
            assert REGISTRY.profile(model).tokenizer in specs, model
        assert O200K not in specs

    def test_every_upstream_adds_its_kinds_vocabularies(self):
        assert at_start("auto", "anthropic", "gemini") == at_start("auto", "anthropic") | at_start("auto", "gemini")


class TestAllAndNamedModels:
    def test_all_loads_every_familys_own_vocabulary(self):
        names = {spec.source for spec in at_start("all", "openai") if spec.kind == "vocab"}
        assert {"llama3", "llama4", "qwen", "qwen3.5", "tekken", "deepseek-v3", "gemma3", "mistral-v1"} <= names
        assert {O200K, CL100K} <= at_start("all")
        assert len(every_family()) == len(set(every_family()))

    def test_named_models_load_theirs_besides_autos(self):
        specs = at_start(("llama-3.1-8b-instruct", "qwen3-8b"), "openai")
        assert specs == at_start("auto", "openai") | {TokenizerSpec("vocab", "llama3"), TokenizerSpec("vocab", "qwen")}
