"""Model families other than OpenAI's and their chat templates' framing: which tokenizer counts
each, which template framing (`ChatFormat`) it carries, matched by name
(`proxy.core.models.model_registry.family_for`), and the `TokenizerSpec` that names a tokenizer.

OpenAI's values live beside the OpenAI families in `proxy.core.models.model_registry`. The open
families' values below were measured once from each family's own template
(tests/data/families/templates, from llama.cpp's models/templates, and mistral-common's request
encoding) with the family's own tokenizer; tests/core/models/test_families_chat.py renders whole
requests with the real templates and checks the counts against them.

Where a family's own tokenizer ships in a package (`vocab:`, proxy.tokenizers.family_vocabularies)
its count is exact; elsewhere (`bound:`, proxy.core.counting.bound) it is an upper bound proven on
the corpus in tests/data/families. docs/counting.md lists each family's source, version and worst
case.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, NamedTuple

from proxy.core.costs.images import AreaCost, FixedTileCost, ImageCostScheme, ResolutionCost


@dataclass(frozen=True, slots=True)
class ChatFormat:
    """Token overheads of a chat template.

    OpenAI's message values are the ones the OpenAI cookbook measured against
    `usage.prompt_tokens`; its tool values were measured against the API by open-source counters
    (the sources and the cases each one covers are pinned in tests/core/costs/test_tools_api_counts.py).
    Other families use an upper bound of their templates' framing (role header, separators,
    end-of-turn, tool tags), since their providers publish no such constants.
    """

    per_message: int = 3
    per_name: int = 1
    reply_priming: int = 3
    # True: tools are shown as OpenAI's `namespace functions` (proxy.core.costs.tool_schema); False: as
    # the JSON a chat template dumps, counted as an upper bound (proxy.core.costs.tools).
    namespace_tools: bool = True
    functions_overhead: int = 9  # the namespace's own message, added once when functions are given
    system_join: int = -4  # the namespace joins the first system message instead of making its own
    # An assistant `function_call` (or single tool call) around its name and arguments: ` to`, `=`,
    # `functions` (3), and 3 more on today's models (measured in 2026 on gpt-4o, gpt-4o-mini and
    # gpt-4.1-mini: a call with its result costs 3 more than on the 0613 models).
    function_call_overhead: int = 6
    # What a call's or a forced call's name is written after (` to=functions.NAME`): a name that
    # starts with letters merges with the dot (`.get`), and some split differently after it
    # (`calculator` is one token, `.calcul` + `ator` two), so the name is counted with it.
    call_name_prefix: str = "."
    function_message_adjust: int = -2  # a `function` result message, relative to a named message
    forced_call_overhead: int = 4  # `function_call` / `tool_choice` naming a function, besides the name
    choice_none: int = 1  # `function_call: "none"`
    parallel_results_overhead: int = 10  # the joined results of one multi_tool_use.parallel call
    parallel_calls_measured: bool = False  # True where API counts of parallel calls were pinned
    calls_measured: bool = True  # False: single calls counted with another generation's framing
    tools_measured: bool = True  # False: tool definitions carry a bound measured only in aggregate
    tool_call_margin: int = 0  # per tool call, where the call framing is not published (an upper bound)
    # Why this model's message framing is a bound and not a measurement; empty where it was measured.
    messages_bound: str = ""
    # The Responses API's rendering where it differs from chat's (proxy.apis.openai.responses): per
    # assistant message of the history, per request, and why that is a bound if it is one.
    responses_assistant: int = 0
    responses_extra: int = 0
    responses_bound: str = ""
    # Open models' templates (below): framing a role's messages carry beyond
    # `per_message` (never negative, so that a caller that replaces `per_message` with a measured
    # value can only count more), and what the template writes when the request has no system or
    # developer message of its own (Llama 3.1's dated system block, Qwen 2.5's default prompt).
    role_extra: tuple[tuple[str, int], ...] = ()
    default_system: int = 0
    # The template writes a tool result's text as a JSON string (`content | tojson`: every quote,
    # backslash and newline escaped), as Llama 3.1's does.
    results_as_json: bool = False
    # The template writes a call's arguments with `tojson`: a string of JSON becomes an escaped JSON
    # string (servers that parse the arguments first render fewer tokens; counted as the larger).
    arguments_as_json: bool = False
    # False: the template writes no role names (Mistral's `[INST]`, DeepSeek's `<|User|>`): a role
    # listed in `role_extra` costs that framing alone, not its name's tokens (other roles still count
    # their name). A raw prompt (legacy completions) writes none either.
    roles_written: bool = True
    # What a server adds to a raw prompt: the BOS token of the families whose tokenizers add one
    # (Llama, Mistral, Gemma); OpenAI's, Qwen's and DeepSeek V3's add nothing.
    prompt_bos: int = 0


# Hermes-, Qwen- and Llama-style templates: tools are JSON in the system turn under a preamble,
# calls are JSON inside tags, results are wrapped in tags. Bounds from those templates' text.
TEMPLATE_FORMAT = ChatFormat(
    prompt_bos=1,  # unknown templates: as if they opened with a BOS (one token more at most)
    per_message=6,
    per_name=2,
    reply_priming=6,
    namespace_tools=False,
    functions_overhead=160,
    system_join=0,
    function_call_overhead=16,
    function_message_adjust=8,
    forced_call_overhead=16,
    choice_none=16,
    parallel_results_overhead=16,
    tool_call_margin=4,
    call_name_prefix="",
)


# Open families' templates write a call's arguments, and most their tool definitions, with `tojson`.
_OPEN = replace(TEMPLATE_FORMAT, arguments_as_json=True)
# Open families: the message framing measured from each template with the family's tokenizer;
# tools, calls and results keep TEMPLATE_FORMAT's bounds (tools as four-space-indented JSON under
# a 160-token preamble bound: every template here writes them more compactly or with less text).
# Names are not rendered by these templates; counting them (as TEMPLATE_FORMAT does) only adds.
#
# Llama 3.x: `<|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|>` (4 + the role), the
# reply `<|begin_of_text|><|start_header_id|>assistant<|end_header_id|>\n\n` (5).
LLAMA3_FORMAT = replace(_OPEN, per_message=4, reply_priming=5)
# Llama 3.1-3.3 always write a system block: "Cutting Knowledge Date: December 2023\nToday Date:
# 26 Jul 2024\n\n" (20 tokens at the longest date of 2024-2033) inside the request's system
# message, or in a block of its own (25 with its header and end) when there is none.
# A tool result is written as `content | tojson` (a string is iterable to Jinja): a JSON string.
LLAMA31_FORMAT = replace(LLAMA3_FORMAT, role_extra=(("system", 20),), default_system=25, results_as_json=True)
# Llama 4: `<|header_start|>ROLE<|header_end|>\n\nCONTENT<|eot|>`, the same shape.
LLAMA4_FORMAT = LLAMA3_FORMAT
# ChatML (Qwen): `<|im_start|>ROLE\nCONTENT<|im_end|>\n` (4 + the role), the reply
# `<|im_start|>assistant\n` (3). Qwen 2.5 writes "You are Qwen, created by Alibaba Cloud. You are a
# helpful assistant." as the system message when there is none (21 tokens with its frame); Qwen 2
# and 1.5 "You are a helpful assistant." (11).
QWEN25_FORMAT = replace(_OPEN, per_message=4, reply_priming=3, default_system=21, prompt_bos=0)  # no BOS
QWEN2_FORMAT = replace(QWEN25_FORMAT, default_system=11)
# Qwen 3 writes no default system message; with thinking off its reply opens with an empty
# `<think>\n\n</think>\n\n` (6 tokens in qwen.tiktoken's spelling, 4 where they are special).
QWEN3_FORMAT = replace(QWEN25_FORMAT, default_system=0, reply_priming=3 + 6)
QWEN35_FORMAT = replace(QWEN25_FORMAT, default_system=0, reply_priming=3 + 4)
# Mistral (mistral-common's encoding), which writes no role names: `[INST]CONTENT[/INST]` for a user
# message (2), the answer's text and `</s>` (1), `<s>` once (the reply's 1). The system prompt: v7
# and later (Mistral Large 2411, Small 3, on SentencePiece or Tekken) wrap it in
# `[SYSTEM_PROMPT]...[/SYSTEM_PROMPT]` (2); v2/v3 join it to the last user message with "\n\n"
# (two byte tokens in SentencePiece, at most one in Tekken), counted as the larger.
MISTRAL_FORMAT = replace(
    _OPEN,
    per_message=0,
    reply_priming=1,
    roles_written=False,
    role_extra=(("user", 2), ("assistant", 1), ("system", 2)),
)
MISTRAL_SP_FORMAT = MISTRAL_FORMAT
# Mistral 7B v0.1 and Mixtral 8x7B (v1): `[INST]` and `[/INST]` are text (" [INST]" and " [/INST]": 7
# around a user message), the system prompt joined with "\n\n" (2 byte tokens).
MISTRAL_V1_FORMAT = replace(MISTRAL_FORMAT, role_extra=(("user", 7), ("assistant", 1), ("system", 2)))
# DeepSeek V3.x (its special tokens are written with fullwidth bars, here `|`), no role names:
# `<|User|>CONTENT` (1), `<|Assistant|><think></think>CONTENT<|end_of_sentence|>` (4), the system
# prompts first, as they are (a second one joined with "\n\n": bounded by 1 each),
# `<|begin_of_sentence|>` and the reply's `<|Assistant|><think></think>` (4).
# Its tokenizer_config says `add_bos_token: false`: a raw prompt goes without the BOS the template writes.
DEEPSEEK_FORMAT = replace(
    _OPEN,
    per_message=0,
    reply_priming=4,
    roles_written=False,
    role_extra=(("user", 1), ("assistant", 4), ("system", 1)),
    prompt_bos=0,
)
# DeepSeek V3.2 and V4 (their `encoding_dsv32.py` / `encoding_dsv4.py`, no Jinja template): an
# answer in the history keeps no thinking, `<|Assistant|></think>CONTENT<|end_of_sentence|>` (3),
# and the reply opens `<|Assistant|></think>` in chat mode or `<|Assistant|><think>` when thinking
# (2, with the `<|begin_of_sentence|>`: 3). `<think>` and `</think>` are one token each.
DEEPSEEK_V4_FORMAT = replace(
    DEEPSEEK_FORMAT, reply_priming=3, role_extra=(("user", 1), ("assistant", 3), ("system", 1))
)
# Gemma: `<start_of_turn>ROLE\nCONTENT<end_of_turn>\n` (4 + the role), `<bos>` and the reply's
# `<start_of_turn>model\n` (4); a system message is joined to the first user turn (counted as its own).
GEMMA_FORMAT = replace(_OPEN, per_message=4, reply_priming=4)
# Claude's framing is not published: TEMPLATE_FORMAT's bounds.
CLAUDE_FORMAT = TEMPLATE_FORMAT


TokenizerKind = Literal["tiktoken", "huggingface", "estimate", "vocab", "bound"]


class TokenizerSpec(NamedTuple):
    """Which tokenizer counts a model's text: `kind`, an encoding name or file path, a multiplier.
    A named tuple, not a dataclass: it keys the loaded tokenizers (`proxy.tokenizers.vocabularies`),
    looked up on every request, hashed at C speed."""

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
