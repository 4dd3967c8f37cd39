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
config names (overrides, routes) load at start in every case (`Models.load_configured`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from proxy.core.models.families import OPEN_FAMILIES, UNKNOWN_FAMILY
from proxy.core.models.model_registry import FAMILIES, TokenizerSpec
from proxy.providers.provider import Provider


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
