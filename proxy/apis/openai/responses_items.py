"""OpenAI Responses input read into the core's chat view: the input items one by one
(`read_item`, into an `ItemsBuilder`), the tools (`chat_tools`) and `text.format`
(`chat_response_format`).

Items are read in one walk: a reasoning item waits for the item it precedes, consecutive calls
share one assistant message (as parallel calls do in chat), and a call's outputs answer it by
call_id, so the core sees each call with its outputs as one unit. What the provider adds and the
guard cannot see (hosted tools, stored items, encrypted reasoning, files fetched by id or URL)
is noted on the builder (`provider_adds`), which flags the request `server_state`. Every view
message and part records the item and part it came from, which is all the adapter needs to
write a cut back (`proxy.apis.openai.responses`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.apis.base import HeldContext, InvalidRequest, Origin, Source, ViewBuilder, opaque_part, text_part
from proxy.core.counting.bound import CIPHERTEXT_NOTE, CIPHERTEXT_TOKENS, base64_bytes
from proxy.core.trimming.turns import MARKER, TRIGGER
from proxy.core.work_budget import BLOCK_UNITS, spend

MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})
CALL_TYPES = frozenset({"function_call", "custom_tool_call"})
OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})
TEXT_PART_TYPES = frozenset({"input_text", "output_text"})


# gpt-4o and gpt-4.1 answered 6 below chat's rendering of the same function tool (8 with a call and its
# output after it; four recordings):
# the Responses rendering of tools is not published, and chat's is its bound.
FUNCTION_TOOLS_BOUND = "Responses function tools: counted with chat's rendering, an upper bound (measured 6 to 8 above)"


class ItemsBuilder(ViewBuilder):
    """The view of the input items, built in one walk: reasoning waits for the item it precedes,
    and consecutive calls share one assistant message."""

    def __init__(self) -> None:
        super().__init__()
        self._reasoning: list[int] = []  # reasoning items waiting for the item they precede
        self._reasoning_text: list[str] = []
        self._reasoning_bytes = 0  # what their ciphertexts decode to at most (`CIPHERTEXT_TOKENS`)
        self._call_group: int | None = None  # the view message the last call items went into
        self.marker_tokens = 0  # the bound of the compaction item's encrypted content (`compaction`)

    def provider_adds(self, note: str, held: HeldContext | None = None) -> None:
        """Part of what the model reads is added by the provider (hosted tools' instructions and
        results, stored items, hidden reasoning): the count is neither exact nor a bound."""
        self.provider_holds(f"not counted, no bound: {note}", held)

    def add(self, message: dict[str, Any], origins: Sequence[Origin], parts: Sequence[int | None] = ()) -> None:
        if self._reasoning:
            origins = (*(Origin("input", k) for k in self._reasoning), *origins)
            if self._reasoning_text:
                message["reasoning_content"] = "\n".join(self._reasoning_text)
            if self._reasoning_bytes:
                message[CIPHERTEXT_TOKENS] = self._reasoning_bytes
            self._reasoning, self._reasoning_text, self._reasoning_bytes = [], [], 0
        super().add(message, origins, parts)
        self._call_group = None

    def add_call(self, call: dict[str, Any], index: int) -> None:
        group = self._call_group
        if group is not None and not self._reasoning:
            self.messages[group]["tool_calls"].append(call)
            source = self.sources[group]
            self.sources[group] = Source((*source.origins, Origin("input", index)))
            return
        self.add({"role": "assistant", "content": None, "tool_calls": [call]}, (Origin("input", index),))
        self._call_group = len(self.messages) - 1

    def reasoning(self, item: Mapping[str, Any], index: int) -> None:
        self._reasoning.append(index)
        for key in ("summary", "content"):
            for part in item.get(key) or ():
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    self._reasoning_text.append(part["text"])
        cipher = item.get("encrypted_content")
        if isinstance(cipher, str) and cipher:
            size = base64_bytes(cipher)
            self._reasoning_bytes += size
            self.estimate(f"input[{index}]: {CIPHERTEXT_NOTE}: {size:,} tokens (its ciphertext)")

    def compaction(self, item: Mapping[str, Any], index: int) -> None:
        """The newest compaction item: a pinned marker, its encrypted content counted at the most it
        can decode to, one token per byte (a token is at least one byte of text)."""
        encrypted = item.get("encrypted_content")
        size = math.ceil(len(encrypted) * 3 / 4) if isinstance(encrypted, str) else 0  # base64 -> bytes
        self.marker_tokens += size
        self.estimate(f"input[{index}]: a compaction item, its encrypted content counted as at most {size:,} tokens")
        self.add({"role": "system", "content": "", MARKER: True}, (Origin("input", index),))

    def trigger(self, origins: Sequence[Origin], where: str) -> None:
        """A request to compact (Codex's `compaction_trigger` item, a `/responses/compact` request):
        the latest prompt, with the instructions the provider compacts with, which are not seen."""
        self.provider_adds(f"{where}: the instructions the provider compacts with")
        self.add({"role": "user", "content": "", TRIGGER: True}, origins)

    def finish(self) -> None:
        if self._reasoning:  # reasoning at the very end: kept as a message of its own
            self.add({"role": "assistant", "content": None}, ())


def read_item(build: ItemsBuilder, item: object, k: int) -> None:
    """`input[k]` checked and added to the view by its type."""
    where = f"input[{k}]"
    if not isinstance(item, Mapping):
        raise InvalidRequest(f"{where} must be an object", param=where)
    kind = item.get("type")
    if kind is None and "role" in item:
        kind = "message"
    if not isinstance(kind, str):
        raise InvalidRequest(f"{where} has no 'type'", param=f"{where}.type")
    if kind == "message":
        role = item.get("role")
        if role not in MESSAGE_ROLES:
            raise InvalidRequest(
                f"{where}.role must be one of {', '.join(sorted(MESSAGE_ROLES))}", param=f"{where}.role"
            )
        content, parts = _content(item.get("content"), f"{where}.content")
        _fetched_parts(build, item.get("content"), f"{where}.content")
        build.add({"role": role, "content": content}, (Origin("input", k),), parts)
    elif kind in CALL_TYPES:
        call_id = _string(item, "call_id", where)
        name = _string(item, "name", where)
        arguments = item.get("arguments") if kind == "function_call" else item.get("input")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False, default=str)
        build.add_call({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}, k)
    elif kind in OUTPUT_TYPES:
        call_id = _string(item, "call_id", where)
        content, parts = _content(item.get("output"), f"{where}.output")
        _fetched_parts(build, item.get("output"), f"{where}.output")
        build.add({"role": "tool", "tool_call_id": call_id, "content": content}, (Origin("input", k),), parts)
    elif kind == "reasoning":
        build.reasoning(item, k)
    elif kind == "compaction":
        build.compaction(item, k)
    elif kind == "compaction_trigger":
        build.trigger((Origin("input", k),), where)
    elif kind == "item_reference":
        build.provider_adds(f"{where}: item_reference, an item the provider stores")
        build.add({"role": "system", "content": [opaque_part(dict(item))]}, (Origin("input", k),))
    else:
        _other_item(build, item, kind, k)


def read_items(build: ItemsBuilder, items: Sequence[object]) -> None:
    """Every item read into the view, the items before the newest compaction item too: the provider
    reads every item it is sent (what `/responses/compact` returns puts the user's messages before
    its item, and Codex sends its instructions there), so all are counted; the turns before the
    item are what a cut drops first (`proxy.core.trimming.history.superseded_turns`)."""
    start = compaction_start(items)
    if start:
        build.notes.append(f"input[{start}]: a compaction item; the {start} items before it go first when cut")
    for k in range(len(items)):
        read_item(build, items[k], k)
    build.finish()


def compaction_start(items: Sequence[object]) -> int:
    """The position of the newest compaction item, where the provider starts reading; 0 without one."""
    kinds = (item.get("type") if isinstance(item, Mapping) else None for item in reversed(items))
    return next((len(items) - 1 - k for k, kind in enumerate(kinds) if kind == "compaction"), 0)


def _other_item(build: ItemsBuilder, item: Mapping[str, Any], kind: str, k: int) -> None:
    """Items this adapter does not model (hosted tool calls, computer use, MCP, ...): counted as
    their JSON, and paired by call_id when they are a call and its output."""
    build.provider_adds(f"input[{k}]: {kind} item, which the provider renders itself (counted as its JSON)")
    call_id = item.get("call_id")
    if isinstance(call_id, str) and kind.endswith("_call_output"):
        build.add(
            {"role": "tool", "tool_call_id": call_id, "content": [opaque_part(dict(item))]}, (Origin("input", k),)
        )
    elif isinstance(call_id, str) and kind.endswith("_call"):
        arguments = json.dumps(item, ensure_ascii=False, default=str, separators=(",", ":"))
        build.add_call({"id": call_id, "type": "function", "function": {"name": kind, "arguments": arguments}}, k)
    else:
        build.add({"role": "assistant", "content": [opaque_part(dict(item))]}, (Origin("input", k),))


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{where}.{key} is required and must be a string", param=f"{where}.{key}")
    return value


def _content(content: object, where: str) -> tuple[Any, tuple[int | None, ...]]:
    """A message's content (or a call output) as the view's content, and its part mapping."""
    if isinstance(content, str):
        return content, ()
    if isinstance(content, list):
        spend(BLOCK_UNITS * len(content))
        return [_part(part, f"{where}[{j}]") for j, part in enumerate(content)], tuple(range(len(content)))
    if content is None:
        raise InvalidRequest(f"{where} is required", param=where)
    return [opaque_part(content)], (None,)


def _fetched_parts(build: ItemsBuilder, content: object, where: str) -> None:
    """Files and images sent by id or URL that the provider fetches and extracts itself."""
    for j, part in enumerate(content if isinstance(content, list) else ()):
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "input_file" and not isinstance(part.get("file_data"), str):
            build.provider_adds(f"{where}[{j}]: a file the provider fetches by id or URL")
        elif part.get("type") == "input_image" and not isinstance(part.get("image_url"), str):
            build.provider_adds(f"{where}[{j}]: an image the provider fetches by file_id")


def _part(part: object, where: str) -> dict[str, Any]:
    if not isinstance(part, Mapping):
        raise InvalidRequest(f"{where} must be an object", param=where)
    kind = part.get("type")
    if kind in TEXT_PART_TYPES:
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRequest(f"{where}.text must be a string", param=f"{where}.text")
        return text_part(text)
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "refusal", "refusal": part["refusal"]}
    if kind == "input_image":
        url = part.get("image_url")
        detail = part.get("detail", "auto")
        return {"type": "image_url", "image_url": {"url": url if isinstance(url, str) else "", "detail": detail}}
    if kind == "input_file":
        file: dict[str, Any] = {}
        for key in ("file_data", "file_id", "filename"):
            if isinstance(part.get(key), str):
                file[key] = part[key]
        if isinstance(part.get("file_url"), str) and "file_id" not in file:
            file["file_id"] = part["file_url"]
        return {"type": "file", "file": file}
    if kind == "input_audio" and isinstance(part.get("input_audio"), Mapping):
        return {"type": "input_audio", "input_audio": part["input_audio"]}
    return opaque_part(dict(part))


def chat_tools(tools: object, build: ItemsBuilder) -> list[Any]:
    """The Responses `tools` in the chat shape; built-in tools noted as what the provider adds."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array", param="tools")
    converted: list[Any] = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise InvalidRequest(f"tools[{j}] must be an object", param=f"tools[{j}]")
        if tool.get("type") == "function":
            function = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
            # Responses function tools are strict unless they say otherwise, and strict ones have
            # no measured rendering: the count says so (proxy.core.costs.tool_schema).
            function["strict"] = tool.get("strict", True)
            converted.append({"type": "function", "function": function})
            if FUNCTION_TOOLS_BOUND not in build.notes:
                build.estimate(FUNCTION_TOOLS_BOUND)
        else:
            build.provider_adds(f"tools[{j}]: built-in tool {tool.get('type')!r}, its instructions and results")
            converted.append(dict(tool))
    return converted


def chat_response_format(text: object) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format`, when it is a JSON schema or JSON object."""
    fmt = text.get("format") if isinstance(text, Mapping) else None
    if not isinstance(fmt, Mapping):
        return None
    if fmt.get("type") == "json_schema":
        schema = {key: fmt[key] for key in ("name", "description", "schema", "strict") if key in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None
