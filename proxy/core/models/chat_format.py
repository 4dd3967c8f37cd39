"""Chat templates' token framing (`ChatFormat`), and the values measured for open model families.

OpenAI's values live beside the OpenAI families in `proxy.core.models.model_registry`. The open families' values
below were measured once from each family's own template (tests/data/families/templates, from
llama.cpp's models/templates, and mistral-common's request encoding) with the family's own
tokenizer; tests/core/models/test_families_chat.py renders whole requests with the real templates and
checks the counts against them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


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
