"""A chat template's framing, measured from probe conversations: the arithmetic, with no I/O.

A server that can tokenize renders three tiny conversations (and a fourth with a tool call), and
their counts against the counts of their texts tell the template's cost around each message, the
reply's priming, a default system prompt the template adds, and how it renders tool calls
(`framing_from`). The result (`Framing`) becomes the `ChatFormat` the core counts with. The probes
are data here; asking a server for them is `proxy.server.backends.tokenize.measure_framing`.

    [system, user]                      -> 2 frames + reply priming
    [system, user, assistant, user]     -> 4 frames + reply priming
    [user]                              -> 1 frame + reply priming + a default system prompt, if
                                           the template adds one when the client sent none
    [system, user, assistant+call, tool] -> how a tool call is rendered (SmolLM2's template
                                           drops calls: their names and arguments cost nothing)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from proxy.core.models.model_registry import ChatFormat

PROBE = "x"
# The texts whose own counts the arithmetic subtracts: the probe, each role, a call's arguments.
PROBE_TEXTS = (PROBE, "system", "user", "assistant", "tool", "{}", "function")


@dataclass(frozen=True, slots=True)
class Framing:
    """A chat template's cost around the texts, as measured."""

    per_message: int  # beyond the role's own tokens
    reply_priming: int
    implicit_system: int  # added when the first message is not a system message
    per_tool_call: int | None = None  # around a call's name and arguments; None: not measured
    renders_tool_calls: bool = True  # False: the template drops assistant tool calls entirely
    # A `tool` result as the template shows it (role `tool` and its content), relative to the
    # core's accounting of one (a `function` message named after its call, less `per_name`);
    # None: not measured.
    tool_result_adjust: int | None = None

    def chat_format(self, base: ChatFormat) -> ChatFormat:
        # What the family's format says a template adds per role or without a system message
        # (Llama 3.1's dated preamble, Qwen's default system prompt) is in the measured numbers
        # already: kept, it would be counted twice.
        fmt = replace(
            base, per_message=self.per_message, reply_priming=self.reply_priming, role_extra=(), default_system=0
        )
        if self.tool_result_adjust is not None:
            fmt = replace(fmt, function_message_adjust=self.tool_result_adjust - base.per_name)
        if not self.renders_tool_calls:
            return replace(fmt, function_call_overhead=0, tool_call_margin=0)
        if self.per_tool_call is None:
            return fmt
        return replace(fmt, function_call_overhead=self.per_tool_call)


def _say(role: str) -> dict[str, Any]:
    return {"role": role, "content": PROBE}


_CALL = {"id": "call_1", "type": "function", "function": {"name": PROBE, "arguments": "{}"}}
_TOOL_EXCHANGE = [
    _say("system"),
    _say("user"),
    {"role": "assistant", "content": PROBE, "tool_calls": [_CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": PROBE},
]
# The probe conversations, in the order `framing_from` takes their counts.
PROBE_CONVERSATIONS: tuple[list[dict[str, Any]], ...] = (
    [_say("system"), _say("user")],
    [_say("system"), _say("user"), _say("assistant"), _say("user")],
    [_say("user")],
    _TOOL_EXCHANGE,
)


def framing_from(
    pieces: list[int], two: int | None, four: int | None, one: int | None, exchange: int | None
) -> Framing | None:
    """The framing from the counts of `PROBE_TEXTS` (`pieces`) and of `PROBE_CONVERSATIONS`; None
    if a conversation went uncounted or the numbers make no sense (a template that is not one
    frame per message). An uncounted tool exchange leaves the core's default for calls."""
    text, system, user, assistant, tool, arguments, function = pieces
    if two is None or four is None or one is None:
        return None
    per_message = math.ceil((four - two - assistant - user - 2 * text) / 2)
    priming = two - 2 * per_message - system - user - 2 * text
    implicit = one - (per_message + user + text + priming)
    if per_message < 0 or priming < 0 or implicit < 0:
        return None
    framing = Framing(per_message, priming, implicit)
    if exchange is None:
        return framing
    plain = 4 * per_message + system + user + assistant + tool + 4 * text + priming
    call = exchange - plain  # what the one call added: its framing, its name ("x") and arguments ("{}")
    if call <= 0:
        # Calls are dropped, and their names with them (`BackendCounter.prepare` counts them as nothing): a
        # result costs its frame, its role and its content, as any message does.
        return replace(framing, per_tool_call=0, renders_tool_calls=False, tool_result_adjust=tool - function)
    # Calls are rendered; a result is taken to be shown as any message is, by its role. The core
    # also counts the result's call name, which such templates rarely show: that errs high.
    return replace(framing, per_tool_call=max(0, call - text - arguments), tool_result_adjust=tool - function)
