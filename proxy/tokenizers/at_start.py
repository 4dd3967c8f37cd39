"""Which vocabularies a serving process loads before it says it is ready (`tokenizers.preload`).

Building a vocabulary holds the GIL, and with it the event loop that serves every request and
`/livez`: tiktoken's Rust encoder is built from the ranks in one native call that never lets the
GIL go (66-200 ms for the tiktoken-format vocabularies, measured beside a serving loop), and
DeepSeek's `tokenizer.json` is read the same way (about 450 ms). A thread does not help. A
vocabulary loaded while serving therefore stalls every request once, the first time a model of its
family is named; one loaded at start, before `/readyz` answers 200, stalls nothing that is served.
Each costs memory for as long as the process runs (measured resident growth, bench/hardening.md):

    o200k_base 41-47 MB, cl100k_base 23-25 MB (also the base of every bound: Claude, unknown
    names), gemma/gemma3/gemma4 40-54 MB each, llama3 29, llama4 43, qwen 36, qwen3.5 63,
    tekken 36, deepseek-v3 70, the SentencePiece Mistral vocabularies 5-6 MB each

So what loads at start follows what the upstreams can serve (`auto`, the default), as each
upstream's provider says (`Provider.vocabularies_at_start`):
- `openai`, `azure` and every kind whose models the config cannot tell (`generic`, `auto`,
  vLLM, llama.cpp, Ollama, ...): OpenAI's encodings, o200k_base and cl100k_base;
- `anthropic`: cl100k_base (Claude is counted by a bound over it);
- `gemini`, `vertex`: Gemma's three vocabularies (Gemini's own) and cl100k_base.
cl100k_base is always among them: an unknown model name is counted with the bound over it.
`all` loads every family's (about 440 MB more than `auto`), so that no model's first request stalls the loop
whatever name a client sends; a list of model names loads theirs besides `auto`'s. The models the
config names (overrides, routes) load at start in every case (`configured_tokenizers`, loaded by
`Models.load_configured`); a configured model whose vocabulary package is not installed is counted
with its family's bound, and said so (`missing_vocabularies`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from proxy.config.settings import Settings
from proxy.core.models.families import OPEN_FAMILIES, UNKNOWN_FAMILY
from proxy.core.models.model_registry import FAMILIES, ModelRegistry, TokenizerSpec
from proxy.providers.provider import Provider
from proxy.tokenizers.family_vocabularies import FALLBACK_BOUND
from proxy.tokenizers.vocabularies import Tokenizers


def every_family() -> list[TokenizerSpec]:
    """The tokenizer of every family the model registry knows, each once."""
    families = [family for _, family in (*FAMILIES, *OPEN_FAMILIES)]
    return list(dict.fromkeys(family.tokenizer for family in (*families, UNKNOWN_FAMILY)))


def vocabularies_at_start(
    preload: str | tuple[str, ...], providers: Iterable[Provider], tokenizer_of: Callable[[str], TokenizerSpec]
) -> list[TokenizerSpec]:
    """What `tokenizers.preload` loads at start, for upstreams of these `providers` (each says
    what its models are counted with); `tokenizer_of(model)` is a model's tokenizer as the
    registry resolves it (for a list of names)."""
    if preload == "all":
        return every_family()
    specs = {UNKNOWN_FAMILY.tokenizer: None}
    for provider in providers:
        specs.update(dict.fromkeys(provider.vocabularies_at_start))
    if isinstance(preload, tuple):
        specs.update(dict.fromkeys(tokenizer_of(model) for model in preload))
    return list(specs)


def _named_models(settings: Settings) -> list[str]:
    """The models the config names one by one (overrides and routes that are not globs)."""
    patterns = [m.override.pattern for m in settings.models.overrides] + [r.match for r in settings.routes]
    return [pattern for pattern in dict.fromkeys(patterns) if not any(ch in pattern for ch in "*?[")]


def missing_vocabularies(settings: Settings, registry: ModelRegistry, tokenizers: Tokenizers) -> list[dict[str, str]]:
    """For each model the config names whose family's vocabulary package is not installed: the
    model, the vocabulary, the package, and what counts it instead (the family's bound)."""
    missing = []
    for model in _named_models(settings):
        spec = registry.profile(model).tokenizer
        package = tokenizers.vocabulary_missing(spec)
        if package is not None:
            fallback = f"bound:{FALLBACK_BOUND}"
            missing.append({"model": model, "vocabulary": spec.source, "package": package, "counted_with": fallback})
    return missing


def configured_tokenizers(settings: Settings, registry: ModelRegistry) -> list[TokenizerSpec]:
    """The tokenizers of the models the config names: an override's own tokenizer, and the
    looked-up one of every override or route that names one model rather than a glob."""
    specs: dict[TokenizerSpec, None] = {}
    for model in settings.models.overrides:
        if model.override.tokenizer is not None:
            specs[model.override.tokenizer] = None
    for name in _named_models(settings):
        specs[registry.profile(name).tokenizer] = None
    return list(specs)
