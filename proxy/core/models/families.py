"""Model families other than OpenAI's: which tokenizer counts each and which template framing it
carries, matched by name (`proxy.core.models.model_registry.family_for`), and the
`TokenizerSpec` that names a tokenizer.

Where a family's own tokenizer ships in a package (`vocab:`, proxy.tokenizers.family_vocabularies) its count is
exact; elsewhere (`bound:`, proxy.core.counting.bound) it is an upper bound proven on the corpus in
tests/data/families. docs/counting.md lists each family's source, version and worst case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from proxy.core.costs.images import AreaCost, FixedTileCost, ImageCostScheme, ResolutionCost
from proxy.core.models.chat_format import (
    CLAUDE_FORMAT,
    DEEPSEEK_FORMAT,
    DEEPSEEK_V4_FORMAT,
    GEMMA_FORMAT,
    LLAMA3_FORMAT,
    LLAMA4_FORMAT,
    LLAMA31_FORMAT,
    MISTRAL_FORMAT,
    MISTRAL_SP_FORMAT,
    MISTRAL_V1_FORMAT,
    QWEN2_FORMAT,
    QWEN3_FORMAT,
    QWEN25_FORMAT,
    QWEN35_FORMAT,
    TEMPLATE_FORMAT,
    ChatFormat,
)

TokenizerKind = Literal["tiktoken", "huggingface", "estimate", "vocab", "bound"]


@dataclass(frozen=True, slots=True)
class TokenizerSpec:
    """Which tokenizer counts a model's text: `kind`, an encoding name or file path, a multiplier."""

    kind: TokenizerKind
    source: str = ""
    multiplier: float = 1.0

    @classmethod
    def parse(cls, text: str) -> TokenizerSpec:
        """`tiktoken:o200k_base`, `tiktoken:o200k_base*1.45`, `huggingface:/path/tokenizer.json*1.1`,
        `estimate:3.0` (ASCII characters per token; other characters one token each) or
        `estimate:3.0:bytes` (other characters one token per UTF-8 byte), `vocab:llama3` (a model
        family's own vocabulary, shipped in a package: `proxy.tokenizers.family_vocabularies.VOCABULARIES`) or
        `bound:open` (an upper bound over cl100k_base with per-class terms: `proxy.core.counting.bound.BOUNDS`)."""
        kind, _, rest = text.partition(":")
        source, star, mult = rest.rpartition("*") if "*" in rest else (rest, "", "")
        if kind not in ("tiktoken", "huggingface", "estimate", "vocab", "bound"):
            raise ValueError(f"unknown tokenizer kind {kind!r}; known: tiktoken, huggingface, estimate, vocab, bound")
        if not source:
            raise ValueError(f"tokenizer {text!r} names no encoding, file or ratio")
        try:
            multiplier = float(mult) if star else 1.0
            if kind == "estimate":
                ratio, _, mode = source.partition(":")
                if float(ratio) <= 0 or mode not in ("", "bytes"):
                    raise ValueError

        except ValueError:
            raise ValueError(f"tokenizer {text!r} has a number that does not parse") from None
        if multiplier < 1.0:
            raise ValueError(f"tokenizer {text!r}: a multiplier below 1 would undercount")
        return cls(kind, source, multiplier)  # type: ignore[arg-type]  # kind checked above

    def __str__(self) -> str:
        suffix = f"*{self.multiplier:g}" if self.multiplier != 1.0 else ""
        return f"{self.kind}:{self.source}{suffix}"


@dataclass(frozen=True, slots=True)
class Family:
    tokenizer: TokenizerSpec
    chat_format: ChatFormat
    images: ImageCostScheme
    exact: bool  # the tokenizer is the model's own
    # How far above the provider's count this family's count can be (real >= count / ratio), for
    # a tokenizer that is the family's vocabulary but not the model's framing; asks the provider
    # at the budget's edge (proxy.core.counting.edge.bound_ratio_of).
    bound_ratio: float | None = None


def _vocab(name: str) -> TokenizerSpec:
    return TokenizerSpec("vocab", name)


def _family(vocabulary: str, fmt: ChatFormat) -> Family:
    return Family(_vocab(vocabulary), fmt, AreaCost(), True)


_OPEN_BOUND = TokenizerSpec("bound", "open")
_BOUNDED = Family(_OPEN_BOUND, TEMPLATE_FORMAT, AreaCost(), False)


_GEMINI_BOUNDED = Family(_OPEN_BOUND, GEMMA_FORMAT, FixedTileCost(), False)


_GEMINI_TILES = FixedTileCost()  # Gemini 1.x and 2.x: 258 tokens a 768 px tile


# Gemini counted with its Gemma vocabulary: the text counts what google-genai counts, and Gemma's
# template framing (4 + the role per turn, 4 for the reply) is all that is over. Measured against
# google-genai's LocalTokenizer on conversations of corpus text (tests/tokenizers/test_gemma.py,
# docs/counting.md): turns of 50 characters at most 1.41, of 100 at most 1.14, longer ones 1.09.
GEMINI_FRAMING_RATIO = 1.5


def _gemini(vocabulary: str, images: ImageCostScheme = _GEMINI_TILES) -> Family:
    return Family(_vocab(vocabulary), GEMMA_FORMAT, images, False, GEMINI_FRAMING_RATIO)


def _gemma(vocabulary: str) -> Family:
    return Family(_vocab(vocabulary), GEMMA_FORMAT, FixedTileCost(), True)


def _each(patterns: tuple[str, ...], family: Family) -> tuple[tuple[str, Family], ...]:
    return tuple((pattern, family) for pattern in patterns)


# Matched against lower-cased names without their prefixes (`llama-3.1-8b-instruct`,
# `meta.llama3-1-70b-instruct-v1:0` on Bedrock, `llama-v3p1-8b-instruct` on Fireworks), first match wins.
OPEN_FAMILIES: tuple[tuple[str, Family], ...] = (
    *_each(("*claude*",), Family(TokenizerSpec("bound", "claude"), CLAUDE_FORMAT, AreaCost(), False)),
    # Gemini and Gemma: the Gemma vocabulary Google's SDKs count each with (proxy.tokenizers.gemma).
    # Gemini's count is not marked exact: its framing inside countTokens is not published and is
    # counted as Gemma's template (an upper bound); an upstream's `provider_count_ratio` has the
    # provider's own count decide at the budget's edge (docs/counting.md).
    # Gemini 3 prices an image by the media resolution asked (proxy.core.costs.images.ResolutionCost).
    *_each(("*gemini-3.[1-9]*", "*gemini-3p[1-9]*"), _gemini("gemma4", ResolutionCost())),
    *_each(("*gemini-3-*", "*gemini-3"), _gemini("gemma3", ResolutionCost())),
    *_each(("*gemini-2.*", "*gemini-live-2.*"), _gemini("gemma3")),
    *_each(("*gemini-1.*", "*gemini-pro", "*gemini-pro-vision", "*gemini-1-*"), _gemini("gemma")),
    *_each(("*gemma-4*", "*gemma4*"), _gemma("gemma4")),
    *_each(("*gemma-3n*", "*gemma3n*"), _GEMINI_BOUNDED),  # Gemma 3n's vocabulary differs and is not shipped
    *_each(("*gemma-3*", "*gemma3*"), _gemma("gemma3")),
    *_each(("*gemma-[27]b*", "*gemma-1.1*", "*gemma-2-*", "*gemma2*", "*codegemma*"), _gemma("gemma")),
    *_each(("*gemini*", "*gemma*"), _GEMINI_BOUNDED),  # a version no SDK maps yet
    # DeepSeek's R1 distills: their base model's vocabulary, DeepSeek's template.
    *_each(("*deepseek*distill*llama*",), _family("llama3", DEEPSEEK_FORMAT)),
    *_each(("*deepseek*distill*qwen*",), _family("qwen", DEEPSEEK_FORMAT)),
    *_each(("*llama-4*", "*llama4*", "*llama-v4*"), _family("llama4", LLAMA4_FORMAT)),
    *_each(
        ("*llama-3.[123]*", "*llama3.[123]*", "*llama3-[123]-*", "*llama-3-[123]-*", "*llama-v3p[123]*"),
        _family("llama3", LLAMA31_FORMAT),
    ),
    # Llama 3.0 (not `codellama-34b`: a version is followed by `-`, `:` or the end)
    *_each(
        ("*llama-3-*", "*llama3-*", "*llama-3", "*llama3", "*llama3:*", "*llama-v3-*"),
        _family("llama3", LLAMA3_FORMAT),
    ),
    *_each(("*llama*",), _BOUNDED),  # Llama 2, Code Llama: a 32k SentencePiece vocabulary, not shipped
    *_each(("*qwen3.5*", "*qwen3.6*", "*qwen3p5*", "*qwen3p6*"), _family("qwen3.5", QWEN35_FORMAT)),
    *_each(("*qwen3*", "*qwq*"), _family("qwen", QWEN3_FORMAT)),
    *_each(("*qwen2-*", "*qwen2:*", "*qwen1.5*", "*qwen-[0-9]*"), _family("qwen", QWEN2_FORMAT)),
    *_each(("*qwen*",), _family("qwen", QWEN25_FORMAT)),
    # Mistral: mistral-common's own model-to-tokenizer mapping (v1, v2, v3, v7 SentencePiece; Tekken after).
    *_each(
        (
            "*mistral-7b*v0.3*",
            "*mixtral-8x22b*",
            "*codestral-2405*",
            "*codestral-22b*",
            "*mathstral*",
            "*mistral-large-2407*",
            "*mistral-large-instruct-2407*",
            "*mistral-small-2409*",
            "*mistral-small-instruct-2409*",
        ),
        _family("mistral-v3", MISTRAL_SP_FORMAT),
    ),
    *_each(
        ("*mistral-large-2411*", "*mistral-large-instruct-2411*", "*pixtral-large*"),
        _family("mistral-v7", MISTRAL_SP_FORMAT),
    ),
    *_each(("*mistral-small-2402*", "*mistral-large-2402*"), _family("mistral-v2", MISTRAL_SP_FORMAT)),
    *_each(("*mistral-7b*", "*mixtral*", "*mistral-tiny*"), _family("mistral-v1", MISTRAL_V1_FORMAT)),
    *_each(("*istral*", "*codestral*", "*pixtral*", "*devstral*", "*magistral*"), _family("tekken", MISTRAL_FORMAT)),
    # DeepSeek V3 and later; the older 100k (deepseek-llm, V2) and 32k (coder) vocabularies are bounded.
    *_each(
        ("*deepseek-llm*", "*deepseek-v2*", "*deepseek-coder-v2*", "*deepseek-coder-[0-9]*", "*deepseek-moe*"), _BOUNDED
    ),
    *_each(
        ("*deepseek-v4*", "*deepseek.v4*", "*deepseek-v3.2*", "*deepseek.v3.2*", "*deepseek-v3-2*", "*deepseek-v3p2*"),
        _family("deepseek-v3", DEEPSEEK_V4_FORMAT),
    ),
    *_each(("*deepseek*",), _family("deepseek-v3", DEEPSEEK_FORMAT)),
)
UNKNOWN_FAMILY = _BOUNDED
