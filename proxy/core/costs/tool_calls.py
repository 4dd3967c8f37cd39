"""How tool calls and their results are framed in the prompt, and what each costs.

OpenAI renders a conversation's tool traffic in two ways (tests/core/costs/test_tools_api_counts.py
pins the API-reported counts behind each rule):

- **One call** (an assistant `function_call`, or `tool_calls` with one entry) is shown as a
  call to that function, its recipient in the message header (` to=functions.NAME`):
  `function_call_overhead`, the name as tokenized after its dot (`call_name_prefix`), and the
  `arguments` string as sent, whitespace included. The call's id is not shown. Its `tool`
  result is shown as a `function` message named after the call: the role, the name (on its
  own: no dot), `per_name`, the content and `function_message_adjust` (-2). The overhead is 3
  on the 0613 models (` to`, `=`, `functions`; measured in 2023) and 6 on today's (gpt-4o,
  gpt-4o-mini, gpt-4.1-mini, measured in 2026: a call with its result costs 3 more; where the
  3 sit, call or result, no count tells apart, so they go with the call, which is never
  dropped without its results).
- **Several calls in one message** are shown as one call to `multi_tool_use.parallel` whose
  argument is `{"tool_uses": [{"recipient_name": name, "parameters": arguments}, ...]}`, and
  their results as one JSON list of the result texts, in message order; both serialised like
  Python's `json.dumps` (", " and ": " separators, non-ASCII escaped as \\uXXXX, which is why
  non-Latin results cost several times more after parallel calls). The group costs the two JSON
  texts, `function_call_overhead` and `parallel_results_overhead` (10), beside the assistant
  message's own framing; the tool messages carry no framing of their own. Measured on the 0613
  models only: on today's models the same rule, with their larger call overhead, is an
  estimate and says so.

The dot is why the sources seemed to disagree by one token on single calls: most names start
with a word that merges with it (`.get`, `.do`), which costs what the bare name costs, but
`calculator` is one token alone and two after the dot. Custom (non-function) calls have no
published rendering: their JSON. Formats whose call framing is not published add
`tool_call_margin` per call and say so.

Results are matched to calls by `tool_call_id`, so a result's cost depends on the call it
answers: `result_contexts()` reads that once per request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeGuard

from proxy.core.models.model_registry import ChatFormat


class ResultContext(NamedTuple):
    """What a `tool` message answers: the called function's name (None when no earlier call has
    its id) and, for a result of a parallel call, the index of the assistant message that made it
    and whether the result opens or closes the joined list. A named tuple, not a dataclass: it is
    part of every tool result's cache key, hashed and compared at C speed on every request."""

    name: str | None
    group: int | None = None
    first: bool = False
    last: bool = False


def result_contexts(messages: Sequence[Any]) -> dict[int, ResultContext]:
    """The context of every `tool` message, by index; a later call with the same id wins."""
    calls: dict[str, ResultContext] = {}
    contexts: dict[int, ResultContext] = {}
    scan_calls(messages, 0, len(messages), calls, contexts)
    return flag_groups(contexts)


def scan_calls(
    messages: Sequence[Any], start: int, end: int, calls: dict[str, ResultContext], contexts: dict[int, ResultContext]
) -> None:
    """Read `messages[start:end]` into `calls` (the calls made so far, by id) and `contexts` (each
    `tool` message's, without the group flags), which hold what came before `start`."""
    for index in range(start, end):
        message = messages[index]
        if type(message) is not dict and not isinstance(message, Mapping):  # the concrete type first: 10x faster
            continue
        if message.get("role") == "tool":
            call_id = message.get("tool_call_id")
            known = calls.get(call_id) if isinstance(call_id, str) else None
            contexts[index] = known if known is not None else ResultContext(None)
            continue
        if not message.get("tool_calls"):  # most messages make no call
            continue
        entries = function_calls(message)
        group = index if len(entries) > 1 else None
        for entry in entries:
            call_id = entry.get("id")
            if isinstance(call_id, str):
                calls[call_id] = ResultContext(_name(entry), group)


def flag_groups(contexts: Mapping[int, ResultContext]) -> dict[int, ResultContext]:
    """`contexts` with the first and last result of each parallel call's group marked."""
    flagged = dict(contexts)
    members: dict[int, list[int]] = {}
    for index, context in contexts.items():
        if context.group is not None:
            members.setdefault(context.group, []).append(index)
    for indices in members.values():
        first, last = min(indices), max(indices)
        flagged[first] = flagged[first]._replace(first=True)
        flagged[last] = flagged[last]._replace(last=True)
    return flagged


def calls_tokens(
    message: Mapping[str, Any], fmt: ChatFormat, text: Callable[[str], int], short: Callable[[str], int]
) -> tuple[int, list[str]]:
    """Tokens of the calls an assistant message makes (`text` counts long texts, `short` names),
    and why they are an estimate, if they are."""
    total = 0
    notes: list[str] = []
    legacy = message.get("function_call")
    if isinstance(legacy, Mapping):
        name, arguments = single_call_parts({"function": legacy}) or ("", "")
        total += fmt.function_call_overhead + short(fmt.call_name_prefix + name) + text(arguments)
    calls = function_calls(message)
    if len(calls) > 1 and fmt.namespace_tools and all(single_call_parts(c) for c in calls):
        uses, parsed = parallel_uses_text(calls)
        if not parsed:
            notes.append("parallel tool call arguments that are not JSON: counted as strings")
        if not fmt.parallel_calls_measured:
            notes.append("parallel tool calls: measured on the 0613 models only; counted with this model's framing")
        return total + fmt.function_call_overhead + text(uses), notes
    for call in calls:
        parts = single_call_parts(call)
        if parts is None:
            total += fmt.function_call_overhead + text(json.dumps(call, ensure_ascii=False, default=str))
            notes.append(f"tool call of type {call.get('type')!r}: no published rendering; counted as its JSON")
            continue
        name, arguments = parts
        total += fmt.function_call_overhead + short(fmt.call_name_prefix + name) + text(arguments)
        total += fmt.tool_call_margin
    if fmt.tool_call_margin and len(notes) < len(calls):
        notes.append(f"tool call framing not published: {fmt.tool_call_margin} token(s) of margin per call")
    elif (calls or isinstance(legacy, Mapping)) and not fmt.calls_measured:
        notes.append("tool call framing not measured for this model: counted with today's (the larger)")
    return total, notes


def result_framing(
    message: Mapping[str, Any], context: ResultContext, fmt: ChatFormat, short: Callable[[str], int], notes: list[str]
) -> int:
    """Tokens of a single call's `tool` result besides its content: it is shown as a `function`
    message named after the call it answers (its `tool_call_id` stands in for an unknown name)."""
    call_id = message.get("tool_call_id")
    name = context.name if context.name is not None else (call_id if isinstance(call_id, str) else "")
    if context.name is None:
        notes.append("tool result answers no earlier call; its tool_call_id counted as the name")
    return fmt.per_message + short("function") + fmt.function_message_adjust + short(name) + fmt.per_name


def function_calls(message: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The entries of an assistant message's `tool_calls`, objects only."""
    calls = message.get("tool_calls")
    return [c for c in calls if _is_mapping(c)] if isinstance(calls, list) else []


def _is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    """`isinstance(value, Mapping)`, the concrete type first: a parsed body holds dicts, and the
    check against the ABC alone is ten times slower (this runs for every call of every request)."""
    return type(value) is dict or isinstance(value, Mapping)


def parallel_uses_text(calls: Sequence[Mapping[str, Any]]) -> tuple[str, bool]:
    """The `multi_tool_use.parallel` argument the model is shown for several calls, and whether
    every call's arguments parsed as JSON (otherwise they are shown as strings: an estimate)."""
    uses: list[dict[str, Any]] = []
    parsed = True
    for call in calls:
        arguments = _arguments(call)
        try:
            parameters: Any = json.loads(arguments) if arguments else {}
        except ValueError:
            parameters, parsed = arguments, False
        uses.append({"recipient_name": _name(call), "parameters": parameters})
    return json.dumps({"tool_uses": uses}), parsed


def parallel_results_text(texts: Sequence[str]) -> str:
    """The results of one parallel call, as the model is shown them."""
    return json.dumps(list(texts))


def parallel_result_piece(text: str, context: ResultContext) -> str:
    """One result's piece of `parallel_results_text`: the pieces of a group, in order, join into
    it exactly, and (the tokenizers' pre-splitting breaks at the space after every comma) their
    token counts add up to its count, so each result is counted on its own."""
    return ("[" if context.first else " ") + json.dumps(text) + ("]" if context.last else ",")


def single_call_parts(call: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, arguments as sent) of a function call; None for a call that is not a function's."""
    function = call.get("function") if "function" in call else call
    if not _is_mapping(function) or call.get("type", "function") != "function":
        return None
    return _name(call), _arguments(call)


def _name(call: Mapping[str, Any]) -> str:
    function = call.get("function")
    name = (function if _is_mapping(function) else call).get("name")
    return name if isinstance(name, str) else ""


def _arguments(call: Mapping[str, Any]) -> str:
    function = call.get("function")
    arguments = (function if _is_mapping(function) else call).get("arguments")
    if isinstance(arguments, str):
        return arguments
    return "" if arguments is None else json.dumps(arguments, ensure_ascii=False)
