"""Gemini `contents` read into the core's chat view: the system instruction and each turn, part by
part (`read_system`, `Turns.read`).

    user turn      its functionResponse parts first, one tool message each (answering the
                   functionCall of the model turn before it), then a user message with its other
                   parts (text, inlineData, fileData, ...)
    model turn     one assistant message: text parts as text, functionCall parts as tool_calls,
                   thought parts as `reasoning_content` (counted, never cut); a part carrying a
                   `thoughtSignature`, executable code and its result are counted as their JSON
                   (the signature itself left out: the model reads none of it) and never shortened
    inlineData     by its MIME type: an image priced by Gemini's tiles (on Gemini 3 by the
                   part's `mediaResolution`, else the request's, `resolution_of`), audio and video at
                   Gemini's rates for their lengths, a PDF by its pages; anything else as a file
    fileData       a file by URI: the guard cannot see it (`proxy.apis.fields.unseen_parts`)

Function calls carry an `id` on newer models; where they do not, each call gets one of the view's
own and the user turn after it answers its calls by id, then by name, then in order, as Gemini
pairs them. A model turn's calls and the tool messages answering them are then one atomic unit for
the core, kept or dropped whole. Every view message and part records the turn and part it came
from (`Origin`, `Source.parts`), which is all the adapter needs to write a cut back without
rebuilding any part it did not cut.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.apis.base import InvalidRequest, Origin, ViewBuilder, opaque_part, text_part
from proxy.core.trimming.budget import TrimResult
from proxy.core.work_budget import BLOCK_UNITS, spend

ROLES = frozenset({"user", "model", "function"})  # `function`: the v1beta name of a user turn answering calls


def field(obj: Mapping[str, Any], camel: str) -> Any:
    """`obj[camel]`, or its snake_case spelling (the REST API takes both, as proto JSON does)."""
    if camel in obj:
        return obj[camel]
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in camel)
    return obj.get(snake)


def resolution_of(part: Mapping[str, Any], asked: str) -> str:
    """The media resolution an image part is read at: the part's own `mediaResolution` (a level,
    or `{"level": ..., "numTokens": N}`: `LEVEL|N`) over `asked`, the request's
    `generationConfig.mediaResolution` or `high`."""
    own = field(part, "mediaResolution")
    level = field(own, "level") if isinstance(own, Mapping) else own
    level = level if isinstance(level, str) and level else asked
    tokens = field(own, "numTokens") if isinstance(own, Mapping) else None
    if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0:
        return f"{level if level != 'high' else 'MEDIA_RESOLUTION_UNSPECIFIED'}|{tokens}"
    return level


def read_system(system: object, view: ViewBuilder, resolution: str = "high") -> None:
    """`systemInstruction` (a Content, or a bare string) as a pinned system message."""
    if system is None:
        return
    if isinstance(system, str):
        view.add({"role": "system", "content": system}, (Origin("systemInstruction"),))
        return
    if not isinstance(system, Mapping):
        raise InvalidRequest("systemInstruction: must be a Content object", param="systemInstruction")
    parts = _parts_of(system, "systemInstruction")
    shown = [_part(part, view, f"systemInstruction.parts[{j}]", resolution) for j, part in enumerate(parts)]
    view.add({"role": "system", "content": shown}, (Origin("systemInstruction"),), tuple(range(len(parts))))


class Turns:
    """The turns of `contents` read in order, pairing each functionResponse with the call it answers."""

    def __init__(self, view: ViewBuilder, resolution: str = "high") -> None:
        self.view = view
        self.resolution = resolution  # the request's media resolution (`resolution_of`)
        self._open: list[tuple[str, str]] = []  # the last model turn's calls not yet answered: (id, name)

    def read(self, content: object, i: int) -> None:
        where = f"contents[{i}]"
        if not isinstance(content, Mapping):
            raise InvalidRequest(f"{where}: must be an object", param=where)
        role = content.get("role", "user")
        if not isinstance(role, str):
            raise InvalidRequest(f"{where}.role: must be a string", param=f"{where}.role")
        if role not in ROLES:
            raise InvalidRequest(f"{where}.role: must be 'user' or 'model', not {role[:40]!r}", param=f"{where}.role")
        parts = _parts_of(content, where)
        if role == "model":
            self._model(parts, i)
        else:
            self._user(parts, i)

    def _model(self, parts: Sequence[Mapping[str, Any]], i: int) -> None:
        shown: list[dict[str, Any]] = []
        mapping: list[int | None] = []
        calls: list[dict[str, Any]] = []
        thinking: list[str] = []
        for j, part in enumerate(parts):
            where = f"contents[{i}].parts[{j}]"
            call = field(part, "functionCall")
            if call is not None:
                if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
                    raise InvalidRequest(f"{where}.functionCall.name: must be a string", param=f"{where}.functionCall")
                given = call.get("id")
                call_id = given if isinstance(given, str) and given else f"call_{i}_{j}"
                arguments = json.dumps(call.get("args", {}), ensure_ascii=False, default=str)
                calls.append(
                    {"id": call_id, "type": "function", "function": {"name": call["name"], "arguments": arguments}}
                )
                self._open.append((call_id, call["name"]))
            elif part.get("thought") is True and isinstance(part.get("text"), str):
                thinking.append(part["text"])
            elif field(part, "thoughtSignature") is not None and isinstance(part.get("text"), str):
                # Signed: counted as its text, never shortened (Gemini checks the signature against it).
                shown.append(opaque_part({"text": part["text"]}))
                mapping.append(j)
            else:
                shown.append(_part(part, self.view, where, self.resolution))
                mapping.append(j)
        message: dict[str, Any] = {"role": "assistant", "content": shown or None}
        if calls:
            message["tool_calls"] = calls
        if thinking:
            message["reasoning_content"] = "\n".join(thinking)
        self.view.add(message, (Origin("contents", i),), tuple(mapping))

    def _user(self, parts: Sequence[Mapping[str, Any]], i: int) -> None:
        others: list[int] = []
        for j, part in enumerate(parts):
            answer = field(part, "functionResponse")
            if answer is None:
                others.append(j)
                continue
            where = f"contents[{i}].parts[{j}].functionResponse"
            if not isinstance(answer, Mapping) or not isinstance(answer.get("name"), str):
                raise InvalidRequest(f"{where}.name: must be a string", param=where)
            response = answer.get("response", {})
            # `{"output": text}` (what a shortened response is written back as) is its text; the rest its JSON.
            simple = (
                isinstance(response, Mapping) and list(response) == ["output"] and isinstance(response["output"], str)
            )
            result = response["output"] if simple else json.dumps(response, ensure_ascii=False, default=str)
            message = {"role": "tool", "tool_call_id": self._answered(answer), "content": result}
            self.view.add(message, (Origin("contents", i, j),))
        self._open = []
        if not others:
            return
        shown = [_part(parts[j], self.view, f"contents[{i}].parts[{j}]", self.resolution) for j in others]
        if len(others) == len(parts):
            self.view.add({"role": "user", "content": shown}, (Origin("contents", i),), tuple(others))
        else:
            origins = tuple(Origin("contents", i, j) for j in others)
            self.view.add({"role": "user", "content": shown}, origins, tuple(others))

    def _answered(self, answer: Mapping[str, Any]) -> str:
        """The id of the open call `answer` answers: by its id, else its name, else the first open."""
        given = answer.get("id")
        for pick in (
            lambda c: isinstance(given, str) and c[0] == given,
            lambda c: c[1] == answer.get("name"),
            lambda c: True,
        ):
            found = next((c for c in self._open if pick(c)), None)
            if found is not None:
                self._open.remove(found)
                return found[0]
        return given if isinstance(given, str) and given else f"unanswered_{answer.get('name')}"


def _parts_of(content: Mapping[str, Any], where: str) -> list[Mapping[str, Any]]:
    parts = content.get("parts", [])
    if not isinstance(parts, list):
        raise InvalidRequest(f"{where}.parts: must be a list", param=f"{where}.parts")
    spend(BLOCK_UNITS * len(parts))
    for j, part in enumerate(parts):
        if not isinstance(part, Mapping):
            raise InvalidRequest(f"{where}.parts[{j}]: must be an object", param=f"{where}.parts[{j}]")
    return parts


# Audio and video are priced by the core at Gemini's published rates, their lengths read from
# their own structure (`proxy.core.costs.media`).
_URL_SAFE = str.maketrans("-_", "+/")


def _part(part: Mapping[str, Any], view: ViewBuilder, where: str, resolution: str) -> dict[str, Any]:
    """The view part of one Gemini part (not a function call or response)."""
    if "text" in part:
        text = part["text"]
        if not isinstance(text, str):
            raise InvalidRequest(f"{where}.text: must be a string", param=f"{where}.text")
        return text_part(text)
    inline = field(part, "inlineData")
    if inline is not None:
        shown = _inline(inline, view, where, resolution_of(part, resolution))
        metadata = field(part, "videoMetadata")
        fps = field(metadata, "fps") if isinstance(metadata, Mapping) else None
        if shown["type"] == "input_video" and isinstance(fps, int | float) and not isinstance(fps, bool):
            shown["input_video"]["fps"] = fps  # frames a second sampled, when the part asks a rate
        return shown
    data = field(part, "fileData")
    if data is not None:
        uri = data.get("fileUri", data.get("file_uri")) if isinstance(data, Mapping) else None
        return {"type": "file", "file": {"file_id": uri if isinstance(uri, str) else ""}}
    if field(part, "executableCode") is None and field(part, "codeExecutionResult") is None:
        view.estimate(f"{where}: a part of a kind the guard does not know, counted as its JSON")
    shown = {k: v for k, v in part.items() if k not in ("thoughtSignature", "thought_signature")}
    return opaque_part(shown)


def _inline(inline: object, view: ViewBuilder, where: str, resolution: str) -> dict[str, Any]:
    if not isinstance(inline, Mapping) or not isinstance(inline.get("data"), str):
        raise InvalidRequest(f"{where}.inlineData.data: must be a base64 string", param=f"{where}.inlineData")
    mime = field(inline, "mimeType")
    mime = mime.lower() if isinstance(mime, str) else "application/octet-stream"
    data: str = inline["data"]
    if "-" in data or "_" in data:  # URL-safe base64 (what google-genai sends): read as the standard alphabet
        data = data.translate(_URL_SAFE)
    if mime.startswith("image/"):
        return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}", "detail": resolution}}
    if mime.startswith("audio/"):
        kind = mime.split("/", 1)[1]
        return {"type": "input_audio", "input_audio": {"data": data, "format": "wav" if "wav" in kind else kind}}
    if mime.startswith("video/"):
        return {"type": "input_video", "input_video": {"data": data, "detail": resolution}}
    return {"type": "file", "file": {"file_data": f"data:{mime};base64,{data}", "detail": resolution}}


def media_part(mime: str, data: str, view: ViewBuilder, where: str, resolution: str = "high") -> dict[str, Any]:
    """The view part of media sent inline as `data` (base64) of type `mime`, priced as an
    `inlineData` part is (other shapes of Google's APIs send media this way too)."""
    return _inline({"data": data, "mimeType": mime}, view, where, resolution)


def with_output_reserve(body: dict[str, Any], reserve: int, snake: bool) -> None:
    """`body`'s generation config's output limit lowered to `reserve`, spelled as the body spells
    it (`snake`: the API's own spelling, where the config names none yet)."""
    key = "generationConfig" if "generationConfig" in body else "generation_config"
    generation = dict(body.get(key) or {})
    camel = "maxOutputTokens" in generation or (not snake and "max_output_tokens" not in generation)
    generation["maxOutputTokens" if camel else "max_output_tokens"] = reserve
    body[key] = generation


def google_overflow(result: TrimResult) -> str:
    """The guard's refusal as Google words an overflow (its limit: the input budget), then the
    guard's explanation; Google's errors name no field."""
    sentence = f"The input token count ({result.tokens_after}) exceeds the maximum number of tokens allowed "
    return f"{sentence}({result.budget.input_budget}). {result.rejection_message()}"
