"""The `input` of an Interactions request (`proxy.apis.gemini.interactions`) read into the core's chat
view, step by step, and its tools.

    "text"                            -> a user message
    a content, or a list of contents  -> one user message, part for part
    steps:
      user_input                      -> a user message with its content
      model_output                    -> an assistant message with its content
      thought                         -> its summary as the `reasoning_content` of the assistant
                                         message after it (counted, never cut); its signature is
                                         not text the model reads
      function_call                   -> an assistant message with tool_calls; consecutive calls
                                         share one message, as parallel calls do in chat
      function_result                 -> a tool message answering its `call_id`: the call and its
                                         results are one atomic unit for the core
      any other step                  -> counted as its JSON (a hosted tool's call or result,
                                         whose content the step carries)
    content parts                     -> text as text; image, audio, video and document by their
                                         data as Gemini prices inline data
                                         (`proxy.apis.gemini.gemini_parts`); by `uri`, a file the
                                         guard cannot see (`proxy.apis.fields.unseen_parts`)
    tools                             -> `function` tools as chat function tools; built-in tools
                                         (google_search, code_execution, url_context, ...)
                                         counted as their JSON, what they fetch not seen

Every view message records the step it came from (`Origin("input", k)`) and, for a step's
content, the position of each part, which is all the adapter needs to write a cut back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.apis.base import InvalidRequest, Origin, Source, ViewBuilder, opaque_part, text_part
from proxy.apis.gemini.gemini_parts import media_part

CONTENT_TYPES = frozenset({"text", "image", "audio", "video", "document"})
# Built-in tools whose results the provider puts in the prompt without the request showing them.
HOSTED_TOOLS = frozenset(
    {"google_search", "code_execution", "url_context", "google_maps", "file_search", "retrieval", "computer_use",
     "mcp_server", "tool_search"}
)  # fmt: skip
_MEDIA_MIME = {"image": "image/png", "audio": "audio/wav", "video": "video/mp4", "document": "application/pdf"}


def is_content(value: object) -> bool:
    """Whether `value` is one content (a text, an image, ...) rather than a step."""
    return isinstance(value, Mapping) and value.get("type") in CONTENT_TYPES


def content_part(content: object, view: ViewBuilder, where: str) -> dict[str, Any]:
    """The view part of one content."""
    if not isinstance(content, Mapping):
        raise InvalidRequest(f"{where}: must be an object", param=where)
    kind = content.get("type")
    if kind == "text":
        text = content.get("text")
        if not isinstance(text, str):
            raise InvalidRequest(f"{where}.text: must be a string", param=f"{where}.text")
        return text_part(text)
    if kind in _MEDIA_MIME:
        data, uri = content.get("data"), content.get("uri")
        if isinstance(data, str):
            mime = content.get("mime_type", content.get("mimeType"))
            mime = mime if isinstance(mime, str) and mime else _MEDIA_MIME[str(kind)]
            resolution = content.get("resolution")
            return media_part(mime, data, view, where, resolution if isinstance(resolution, str) else "high")
        if isinstance(uri, str):
            return {"type": "file", "file": {"file_id": uri}}
        raise InvalidRequest(f"{where}: an {kind} content needs `data` or `uri`", param=where)
    view.estimate(f"{where}: a content of a kind the guard does not know, counted as its JSON")
    return opaque_part(dict(content))


def content_parts(contents: object, view: ViewBuilder, where: str) -> list[dict[str, Any]]:
    if contents is None:
        return []
    if not isinstance(contents, list):
        raise InvalidRequest(f"{where}: must be a list of contents", param=where)
    return [content_part(c, view, f"{where}[{j}]") for j, c in enumerate(contents)]


class Steps:
    """The steps of `input` read in order: thoughts wait for the message they precede, and
    consecutive function calls share one assistant message."""

    def __init__(self, view: ViewBuilder) -> None:
        self.view = view
        self._thoughts: list[int] = []  # thought steps waiting for the message they precede
        self._thought_text: list[str] = []
        self._calls: int | None = None  # the view message the last function calls went into

    def read(self, step: object, k: int) -> None:
        where = f"input[{k}]"
        if not isinstance(step, Mapping):
            raise InvalidRequest(f"{where}: must be an object", param=where)
        kind = step.get("type")
        if kind == "user_input" or kind == "model_output":
            parts = content_parts(step.get("content"), self.view, f"{where}.content")
            role = "user" if kind == "user_input" else "assistant"
            self._add({"role": role, "content": parts}, k, range(len(parts)))
        elif kind == "thought":
            self._thought(step, k)
        elif kind == "function_call":
            self._call(step, k, where)
        elif kind == "function_result":
            self._result(step, k, where)
        else:
            self.view.estimate(f"{where}: a {str(kind)[:40]} step counted as its JSON")
            self._add({"role": "assistant", "content": [opaque_part(dict(step))]}, k, (None,))

    def finish(self) -> None:
        """A thought with no message after it is its own assistant message."""
        if self._thoughts:
            first = self._thoughts[0]
            self._add({"role": "assistant", "content": None}, first, ())

    def _add(self, message: dict[str, Any], k: int, parts: Sequence[int | None]) -> None:
        origins: tuple[Origin, ...] = (Origin("input", k),)
        if self._thoughts:
            origins = (*(Origin("input", t) for t in self._thoughts if t != k), *origins)
            if self._thought_text:
                message["reasoning_content"] = "\n".join(self._thought_text)
            self._thoughts, self._thought_text = [], []
        self.view.add(message, origins, tuple(parts))
        self._calls = None

    def _thought(self, step: Mapping[str, Any], k: int) -> None:
        self._thoughts.append(k)
        summary = step.get("summary")
        for part in summary if isinstance(summary, list) else ():
            if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                self._thought_text.append(part["text"])

    def _call(self, step: Mapping[str, Any], k: int, where: str) -> None:
        name, call_id = step.get("name"), step.get("id")
        if not isinstance(name, str) or not isinstance(call_id, str):
            raise InvalidRequest(f"{where}: a function_call needs a string `name` and `id`", param=where)
        arguments = json.dumps(step.get("arguments", {}), ensure_ascii=False, default=str)
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        group = self._calls
        if group is not None and not self._thoughts:
            view = self.view
            view.messages[group]["tool_calls"].append(call)
            source = view.sources[group]
            view.sources[group] = Source((*source.origins, Origin("input", k)), source.parts)
            return
        self._add({"role": "assistant", "content": None, "tool_calls": [call]}, k, ())
        self._calls = len(self.view.messages) - 1

    def _result(self, step: Mapping[str, Any], k: int, where: str) -> None:
        call_id = step.get("call_id")
        if not isinstance(call_id, str):
            raise InvalidRequest(f"{where}.call_id: must be a string", param=f"{where}.call_id")
        result = step.get("result")
        if isinstance(result, str):
            content: Any = result
        elif isinstance(result, list):  # contents: texts and media, each priced as its kind
            content = content_parts(result, self.view, f"{where}.result")
        else:
            content = json.dumps(result, ensure_ascii=False, default=str)
        self._add({"role": "tool", "tool_call_id": call_id, "content": content}, k, ())


def chat_tools(tools: object, view: ViewBuilder, unseen: list[str]) -> list[Any]:
    """`tools` as chat tools: function tools as functions, every other tool as its JSON."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("tools: must be a list", param="tools")
    converted: list[Any] = []
    for j, tool in enumerate(tools):
        where = f"tools[{j}]"
        if not isinstance(tool, Mapping):
            raise InvalidRequest(f"{where}: must be an object", param=where)
        kind = tool.get("type")
        if kind == "function":
            if not isinstance(tool.get("name"), str):
                raise InvalidRequest(f"{where}.name: must be a string", param=f"{where}.name")
            function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
            converted.append({"type": "function", "function": function})
            continue
        view.estimate(f"{where}: a {str(kind)[:40]} tool counted as its JSON")
        converted.append(dict(tool))
        if kind in HOSTED_TOOLS:
            unseen.append(f"{where}: what the {kind} tool fetches")
    return converted
