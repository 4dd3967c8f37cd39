"""Anthropic's tools as the core sees them: the Messages `tools` array converted to chat function
tools, and the prompt tokens Anthropic adds for them that no request shows.

Anthropic prices tool use with a system prompt of its own, published per model and `tool_choice`,
and Anthropic-defined tools (bash, the text editor, computer use) with published prompt tokens of
their own; neither is in the body, so both are counted from these tables as fixed tokens. The
tables change with Anthropic's pricing page, not with the adapter's parsing: they live here.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping
from typing import Any

from proxy.apis.base import InvalidRequest, ViewBuilder

# The system prompt Anthropic adds when `tools` are given, by model and tool_choice (auto/none,
# any/tool), from its tool-use pricing table. Unknown models get the largest of each column.
TOOL_PROMPT_TOKENS: tuple[tuple[str, int, int], ...] = (
    ("claude-3-opus*", 530, 281),
    ("claude-3-sonnet*", 159, 235),
    ("claude-3-haiku*", 264, 340),
    ("claude-3-5-haiku*", 264, 340),
    ("claude-3-5-sonnet*", 346, 313),
    ("claude-3-7-sonnet*", 346, 313),
    ("claude-*-4*", 346, 313),
    ("claude-4*", 346, 313),
)
TOOL_PROMPT_UNKNOWN = (530, 340)
# Anthropic-defined tools add their own published prompt tokens on top (computer use: the tool's
# 735 and its system prompt's 499 at most); other server tools are counted as their JSON.
SERVER_TOOL_TOKENS: tuple[tuple[str, int], ...] = (("bash_", 245), ("text_editor_", 700), ("computer_", 735 + 499))


def tool_prompt_tokens(model: str | None, tool_choice: object) -> int:
    """The tokens of the tool-use system prompt Anthropic adds for `model` and `tool_choice`."""
    forced = isinstance(tool_choice, Mapping) and tool_choice.get("type") in ("any", "tool")
    name = (model or "").lower().rsplit("/", 1)[-1]
    for pattern, auto, forced_tokens in TOOL_PROMPT_TOKENS:
        if fnmatch.fnmatchcase(name, pattern):
            return forced_tokens if forced else auto
    return TOOL_PROMPT_UNKNOWN[1] if forced else TOOL_PROMPT_UNKNOWN[0]


def chat_tools(tools: object, view: ViewBuilder) -> tuple[list[Any], int]:
    """The Messages `tools` in the chat shape, and the published prompt tokens of the
    Anthropic-defined ones among them."""
    if tools is None:
        return [], 0
    if not isinstance(tools, list):
        raise InvalidRequest("tools: must be an array", param="tools")
    converted: list[Any] = []
    fixed = 0
    for j, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise InvalidRequest(f"tools.{j}: must be an object", param=f"tools.{j}")
        kind = str(tool.get("type") or "")
        fixed += next((tokens for prefix, tokens in SERVER_TOOL_TOKENS if kind.startswith(prefix)), 0)
        if tool.get("type") in (None, "custom") and "input_schema" in tool:
            function = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
            if isinstance(tool.get("description"), str):
                function["description"] = tool["description"]
            examples = tool.get("input_examples")
            if examples is not None:  # shown to the model beside the tool: counted as their JSON, with it
                shown = json.dumps(examples, ensure_ascii=False)
                function["description"] = f"{function.get('description', '')}\n\nExamples: {shown}".lstrip()
                view.estimate(f"tools.{j}: input_examples counted as their JSON")
            converted.append({"type": "function", "function": function})
        else:
            view.estimate(f"tools.{j}: server tool {tool.get('type')!r} estimated from its JSON")
            converted.append(dict(tool))
    return converted, fixed
