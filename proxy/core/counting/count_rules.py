"""What each part of a chat-completions body costs, counted the way the provider will:
`usage.prompt_tokens`, exactly where the format is published, and never below it where it is not.

Every message costs its template framing (`ChatFormat.per_message`), its role, its content (text
parts, images, audio, files), its `name`, its tool calls and any other text field it carries; the
request adds its tool definitions, `tool_choice`, `response_format`, `documents` and the reply
priming.

The total is split into components that add up to it exactly:

    system          system and developer messages
    history         every other message before the latest user message, less the parts below
    latest_user     the latest user message, less its images
    tool_calls      assistant tool calls and legacy function calls
    tool_results    `tool` and legacy `function` messages
    images          image, audio and file parts, wherever they are
    tool_definitions, response_format, documents, reply_priming

`CountRules.message()` counts one message on its own, so that trimming can recount only what it
changed. A `tool` result is the one message whose cost depends on another: the call it answers
(`proxy.core.costs.tool_calls`), which whoever counts the whole request reads first into `_results`.

These are the rules only. Counting a whole request cheaply (cache keys per message, the openings a
conversation shares with the request before, tool definitions counted once, large texts encoded
in one batch) is `proxy.core.counting.request_count`'s `RequestCounter`, which builds on this class.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextvars import Token
from dataclasses import dataclass, field
from typing import Any

from proxy.core.costs.images import image_cost, is_media_resolution
from proxy.core.costs.media import audio_cost, file_cost, video_cost
from proxy.core.costs.tool_calls import ResultContext, calls_tokens, parallel_result_piece, result_framing
from proxy.core.costs.tools import NOTHING, TOOL_FIELDS, ToolsCount, response_format_tokens, tool_definitions_tokens
from proxy.core.counting.bound import CIPHERTEXT_TOKENS
from proxy.core.counting.count_cache import SHORT_ENTRIES, SHORT_TEXT, CountCache, Tally, count_text
from proxy.core.counting.tokenizer import BoundedText, Tokenizer, bounded_text
from proxy.core.models.model_registry import ModelProfile
from proxy.core.trimming.budget import latest_user_index

COMPONENTS = (
    "system",
    "history",
    "latest_user",
    "tool_calls",
    "tool_results",
    "images",
    "tool_definitions",
    "response_format",
    "documents",
    "reply_priming",
)

# Fields of a message that are not shown to the model as text, or are counted elsewhere.
_STRUCTURAL_FIELDS = frozenset({"role", "content", "name", "tool_calls", "function_call", "tool_call_id", "audio"})
# Fields whose values are markers for a gateway or a cache, never prompt text.
_MARKER_FIELDS = frozenset({"cache_control"})


@dataclass(frozen=True, slots=True)
class MessageCount:
    """One message's tokens, framing included, with the parts that belong to other components."""

    index: int
    role: str
    tokens: int
    media_tokens: int = 0  # images, audio, files
    tool_call_tokens: int = 0
    notes: tuple[str, ...] = ()

    @property
    def text_tokens(self) -> int:
        return self.tokens - self.media_tokens - self.tool_call_tokens


@dataclass(frozen=True)
class RequestCount:
    model: str
    tokenizer: str
    exact: bool  # the model's own tokenizer and measured framing throughout; False if any part is estimated
    total: int
    components: Mapping[str, int]
    messages: tuple[MessageCount, ...]
    fixed_tokens: int  # tool definitions + response format + reply priming
    pinned_tokens: int  # the system and developer messages' (never cut)
    notes: tuple[str, ...] = field(default=())
    # Some part's size was estimated or bounded rather than read (media, a part counted as its
    # JSON, a text counted by a bound): what the provider says of this request is about it alone.
    estimated: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.total,
            "tokenizer": self.tokenizer,
            "exact": self.exact,
            "components": dict(self.components),
            "messages": [
                {"index": m.index, "role": m.role, "tokens": m.tokens, **({"notes": list(m.notes)} if m.notes else {})}
                for m in self.messages
            ],
        }


class CountRules:
    """The cost of each part of a request for one model profile with one tokenizer."""

    def __init__(self, profile: ModelProfile, tokenizer: Tokenizer, cache: CountCache | None = None) -> None:
        self.profile = profile
        self.tokenizer = tokenizer
        self.cache = cache
        self.fmt = profile.chat_format
        self._role_extra = dict(self.fmt.role_extra)
        self._small: dict[str, int] = cache.short_counts(tokenizer) if cache is not None else {}
        # What each `tool` message of the request being counted answers, by index.
        self._results: Mapping[int, ResultContext] = {}

    def text(self, text: str) -> int:
        return count_text(self.tokenizer, text, self.cache)

    def _as_json_string(self, text: str) -> int:
        """A text as a template's `tojson` writes a string: quoted, its quotes and newlines escaped."""
        return self.text(json.dumps(text, ensure_ascii=False))

    def _short(self, text: str) -> int:
        """Roles, names and similar short, repeating strings (remembered across requests with a
        cache: `CountCache.short_counts`)."""
        n = self._small.get(text)
        if n is None:
            n = self.tokenizer.count(text)
            if len(text) <= SHORT_TEXT and len(self._small) < SHORT_ENTRIES:
                self._small[text] = n
        return n

    def totals(
        self,
        body: Mapping[str, Any],
        messages: list[Any],
        counts: tuple[MessageCount, ...],
        tally: Tally,
        recording: Token[BoundedText | None],
    ) -> RequestCount:
        """The request's count from its messages' counts and their sums (`tally`): the parts
        outside the messages (the tool definitions first) counted and added, the components split,
        the notes gathered; `recording` (`note_bounded_text`) ends here, after the last text counted."""
        tool_count = self._tool_definitions(body) if any(key in body for key in TOOL_FIELDS) else NOTHING
        format_count = response_format_tokens(body, self.tokenizer, self.fmt) if "response_format" in body else NOTHING
        documents = self._documents(body)
        tools, response_format = tool_count.tokens, format_count.tokens
        components = dict.fromkeys(COMPONENTS, 0)
        components["system"], components["history"] = tally.system, tally.history
        components["tool_results"] = tally.results
        latest = latest_user_index(messages)
        if latest is not None:  # summed as history above, as every user message is
            moved = counts[latest].text_tokens
            components["history"] -= moved
            components["latest_user"] += moved
        components["tool_definitions"] = tools
        components["response_format"] = response_format
        components["documents"] = documents.tokens
        components["reply_priming"] = self.fmt.reply_priming + self._default_system(messages)
        components["images"] += tally.media
        components["tool_calls"] += tally.calls
        notes: list[str] = [*tool_count.notes, *format_count.notes, *documents.notes, *tally.notes]
        bounded = bounded_text(recording).note()
        if bounded:
            notes.append(bounded)
        estimated = bool(notes)  # the notes after these are about the model, not the request's parts
        if self.fmt.messages_bound:
            notes.append(self.fmt.messages_bound)
        if not self.profile.known:
            window = self.profile.context_window
            notes.append(f"model {self.profile.name!r} is not in the model map: assumed a {window}-token window")
        if not self.tokenizer.exact or not self.profile.tokenizer_exact:
            notes.append(f"counted with {self.tokenizer.name}, an estimate for this model that errs high")
        fixed = tools + response_format + documents.tokens + components["reply_priming"]
        return RequestCount(
            model=self.profile.name,
            tokenizer=self.tokenizer.name,
            exact=self.tokenizer.exact and self.profile.tokenizer_exact and not notes,
            total=tally.tokens + fixed,
            components=components,
            messages=counts,
            fixed_tokens=fixed,
            pinned_tokens=tally.pinned,
            notes=tuple(notes),
            estimated=estimated,
        )

    def _tool_definitions(self, body: Mapping[str, Any]) -> ToolsCount:
        """The tool definitions' count (`RequestCounter` keeps it in the count cache)."""
        return tool_definitions_tokens(body, self.tokenizer, self.fmt, self.cache)

    def _default_system(self, messages: list[Any]) -> int:
        """The template's own system turn, written when no message is a system or developer one."""
        if not self.fmt.default_system:
            return 0
        has_system = any(isinstance(m, dict) and m.get("role") in ("system", "developer") for m in messages)
        return 0 if has_system else self.fmt.default_system

    def _documents(self, body: Mapping[str, Any]) -> ToolsCount:
        """A chat body's `documents` (vLLM passes them to the model's chat template, which a
        retrieval model's renders into the prompt): their compact JSON, a bound of any template's
        rendering of them, never cut."""
        documents = body.get("documents")
        if not documents:
            return NOTHING
        text = json.dumps(documents, ensure_ascii=False, separators=(",", ":"), default=str)
        note = "documents: rendered by the server's chat template, if at all; counted as their JSON"
        return ToolsCount(count_text(self.tokenizer, text, self.cache), (note,))

    def message(self, message: object, index: int) -> MessageCount:
        fmt = self.fmt
        if not isinstance(message, Mapping):
            text = json.dumps(message, ensure_ascii=False, default=str)
            return MessageCount(
                index, "unknown", fmt.per_message + self.text(text), notes=("not an object; counted as JSON",)
            )
        role = message.get("role")
        role = role if isinstance(role, str) else "unknown"
        notes: list[str] = []
        context = self._results.get(index, ResultContext(None)) if role == "tool" else None
        if context is not None and context.group is not None and fmt.namespace_tools:
            return self._parallel_result(message, index, context)
        if context is not None:
            tokens = result_framing(message, context, fmt, self._short, notes)
        else:
            extra = self._role_extra.get(role) if self._role_extra else None
            if extra is None:
                tokens = fmt.per_message + self._short(role)
            else:  # a template that writes no role text frames the roles it knows with `role_extra` alone
                tokens = fmt.per_message + (self._short(role) if fmt.roles_written else 0) + extra
            if role == "function":
                tokens += fmt.function_message_adjust
            name = message.get("name")
            if isinstance(name, str) and name:
                tokens += self._short(name) + fmt.per_name
        media_tokens = 0
        content = message.get("content")
        if context is not None and fmt.results_as_json and isinstance(content, str):
            content = json.dumps(content, ensure_ascii=False)  # as the template's `tojson` writes it
        if isinstance(content, str):
            tokens += self.text(content)
        elif isinstance(content, list):
            for j, part in enumerate(content):
                text_tokens, part_media, part_notes = self._part(part)
                tokens += text_tokens + part_media
                media_tokens += part_media
                notes += (f"content[{j}]: {n}" for n in part_notes)
        elif content is not None:
            tokens += self.text(json.dumps(content, ensure_ascii=False, default=str))
        call_tokens = 0
        if "tool_calls" in message or "function_call" in message:
            count_arguments = self._as_json_string if fmt.arguments_as_json else self.text
            call_tokens, call_notes = calls_tokens(message, fmt, count_arguments, self._short)
            notes += call_notes
        tokens += call_tokens
        if len(message) > 2 or "content" not in message:  # {role, content}, most messages, holds nothing more
            tokens += self._other_fields(message, notes)
        return MessageCount(index, role, tokens, media_tokens, call_tokens, tuple(notes))

    def _other_fields(self, message: Mapping[str, Any], notes: list[str]) -> int:
        """Reasoning text, refusals and provider extensions (`reasoning_content`, LiteLLM's
        `thinking_blocks`, OpenRouter's `reasoning_details`): shown to some models, so counted,
        text as text and anything else as its JSON (with a note: a bound, not a count). An
        assistant's earlier audio answer, sent back by id, is not visible here: noted."""
        tokens = 0
        for key, value in message.items():
            if key in _STRUCTURAL_FIELDS or key in _MARKER_FIELDS or value is None or isinstance(value, bool):
                continue
            if key == CIPHERTEXT_TOKENS and isinstance(value, int):  # a bound the adapter worked out
                tokens += value
                continue
            if isinstance(value, str):
                tokens += self.text(value)
            elif isinstance(value, int | float):
                tokens += self._short(str(value))
            else:
                tokens += self.text(json.dumps(value, ensure_ascii=False, default=str))
                notes.append(f"{key}: not text; counted as its JSON")
        audio = message.get("audio")
        if isinstance(audio, Mapping) and "id" in audio and "data" not in audio:
            notes.append("audio: an earlier answer's audio, sent back by id, is not visible to the guard; not counted")
        return tokens

    def _parallel_result(self, message: Mapping[str, Any], index: int, context: ResultContext) -> MessageCount:
        """One result of a parallel call: its piece of the joined JSON list, and the group's
        framing on the first."""
        text, media_tokens, notes = self._result_parts(message.get("content"))
        tokens = self.text(parallel_result_piece(text, context)) + media_tokens
        if context.first:
            tokens += self.fmt.parallel_results_overhead
        return MessageCount(index, "tool", tokens, media_tokens, 0, tuple(notes))

    def _result_parts(self, content: object) -> tuple[str, int, list[str]]:
        """(text, media tokens, notes) of a tool result's content."""
        if isinstance(content, str):
            return content, 0, []
        if not isinstance(content, list):
            return ("" if content is None else json.dumps(content, ensure_ascii=False, default=str)), 0, []
        texts: list[str] = []
        media = 0
        notes: list[str] = []
        for j, part in enumerate(content):
            if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
                continue
            _, part_media, part_notes = self._part(part)
            media += part_media
            notes += (f"content[{j}]: {n}" for n in part_notes)
        return "".join(texts), media, notes

    def _part(self, part: object) -> tuple[int, int, list[str]]:
        """(text tokens, media tokens, notes) of one content part."""
        if not isinstance(part, Mapping):
            return self.text(json.dumps(part, ensure_ascii=False, default=str)), 0, ["not an object; counted as JSON"]
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            return self.text(text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)), 0, []
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return self.text(part["refusal"]), 0, []
        if kind == "image_url":
            return self._image(part)
        if kind == "input_audio":
            return audio_cost(part)
        if kind == "file":
            return file_cost(part, self.profile.images)
        if kind == "input_video":
            return video_cost(part, self.profile.images)
        return (
            self.text(json.dumps(part, ensure_ascii=False, default=str)),
            0,
            [f"unknown part type {kind!r}; counted as JSON"],
        )

    def _image(self, part: Mapping[str, Any]) -> tuple[int, int, list[str]]:
        spec = part.get("image_url")
        url: str = ""
        detail: str = "auto"
        if isinstance(spec, str):
            url = spec
        elif isinstance(spec, Mapping):
            url = spec["url"] if isinstance(spec.get("url"), str) else ""
            asked_detail = spec.get("detail")
            known = asked_detail in ("low", "high", "auto") or is_media_resolution(asked_detail)
            detail = asked_detail if known and isinstance(asked_detail, str) else "auto"
        # `auto` lets the provider choose; the count assumes it chooses `high`. A Gemini media
        # resolution is passed on as it is, for the schemes that price by it.
        asked = detail if is_media_resolution(detail) else "low" if detail == "low" else "high"
        cost = image_cost(url, asked, self.profile.images)
        notes = []
        if cost.estimated:
            where = "a remote URL" if not url.startswith("data:") else "an unreadable data URL"
            notes.append(f"image is {where}; assumed the largest cost for detail={detail} ({cost.tokens} tokens)")
        return 0, cost.tokens, notes
