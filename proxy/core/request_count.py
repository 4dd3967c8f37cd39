"""Counts a chat-completions body the way the provider will: `usage.prompt_tokens`, exactly where
the format is published, and never below it where it is not.

Every message costs its template framing (`ChatFormat.per_message`), its role, its content (text
parts, images, audio, files), its `name`, its tool calls and any other text field it carries; the
request adds its tool definitions, `tool_choice`, `response_format` and the reply priming.

The total is split into components that add up to it exactly:

    system          system and developer messages
    history         every other message before the latest user message, less the parts below
    latest_user     the latest user message, less its images
    tool_calls      assistant tool calls and legacy function calls
    tool_results    `tool` and legacy `function` messages
    images          image, audio and file parts, wherever they are
    tool_definitions, response_format, reply_priming

`RequestCounter.message()` counts one message on its own, so that trimming can recount only what
it changed. A `tool` result is the one message whose cost depends on another: the call it answers
(`proxy.core.tool_calls`), which `request()` reads first.
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson

from proxy.core.images import image_cost
from proxy.core.media import audio_cost, file_cost
from proxy.core.models import ModelProfile
from proxy.core.openings import (
    NO_TALLY,
    Opening,
    Tally,
    opening_key,
    sizes_to_keep,
    sizes_to_look_up,
    still_marked_alike,
)
from proxy.core.roles import latest_user_index
from proxy.core.tokenizer import (
    SHORT_ENTRIES,
    SHORT_TEXT,
    CountCache,
    Tokenizer,
    bounded_text,
    count_text,
    note_bounded_text,
)
from proxy.core.tool_calls import (
    ResultContext,
    calls_tokens,
    flag_groups,
    parallel_result_piece,
    result_contexts,
    result_framing,
    scan_calls,
)
from proxy.core.tools import ToolsCount, first_system_text, response_format_tokens, tool_definitions_tokens

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
            "notes": list(self.notes),
        }


class RequestCounter:
    """Counts bodies for one model profile with one tokenizer; cheap to build per request."""

    def __init__(self, profile: ModelProfile, tokenizer: Tokenizer, cache: CountCache | None = None) -> None:
        self.profile = profile
        self.tokenizer = tokenizer
        self.cache = cache
        self.fmt = profile.chat_format
        self._role_extra = dict(self.fmt.role_extra)
        self._small: dict[str, int] = cache.short_counts(tokenizer) if cache is not None else {}
        # Counts of this request's large texts, encoded in one batch before the walk; keyed by
        # object identity, holding the text so that the identity stays valid.
        self._prefetched: dict[int, tuple[str, int]] = {}
        self._scope = hash((tokenizer.identity, profile.chat_format, profile.images))
        # What each `tool` message of the request being counted answers, by index.
        self._results: dict[int, ResultContext] = {}

    def text(self, text: str) -> int:
        hit = self._prefetched.get(id(text))
        if hit is not None and hit[0] is text:
            return hit[1]
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

    def _tool_definitions(self, body: Mapping[str, Any]) -> ToolsCount:
        """Tool definitions' count, from the cache when the same definitions were counted before:
        an agent sends the same tools with every request. The key holds the first system message
        too, which the namespace joins (its hash is the string's own, kept with it: a re-sent
        system message is the very string read before, `proxy.wire.prefix_reader`)."""
        if self.cache is None or not (body.get("tools") or body.get("functions")):
            return tool_definitions_tokens(body, self.tokenizer, self.fmt, self.cache)
        fields = [body.get(k) for k in ("tools", "functions", "tool_choice", "function_call")]
        messages = body.get("messages")
        system = first_system_text(messages) if isinstance(messages, list) else None
        try:
            key = (self._scope, "tools", hash(orjson.dumps(fields)), hash(system))
        except TypeError:
            return tool_definitions_tokens(body, self.tokenizer, self.fmt, self.cache)
        count: ToolsCount | None = self.cache.get(key)
        if count is None:
            count = tool_definitions_tokens(body, self.tokenizer, self.fmt, self.cache)
            self.cache.put(key, count)
        return count

    def _documents(self, body: Mapping[str, Any]) -> ToolsCount:
        """A chat body's `documents` (vLLM passes them to the model's chat template, which a
        retrieval model's renders into the prompt): their compact JSON, a bound of any template's
        rendering of them, never cut."""
        documents = body.get("documents")
        if not documents:
            return ToolsCount(0)
        text = json.dumps(documents, ensure_ascii=False, separators=(",", ":"), default=str)
        note = "documents: rendered by the server's chat template, if at all; counted as their JSON"
        return ToolsCount(count_text(self.tokenizer, text, self.cache), (note,))

    def _message_keys(self, messages: list[Any], hashes: Sequence[int] = (), start: int = 0) -> list[Hashable | None]:
        """A cache key per message from `start` on: the hash of its compact JSON (which tells `1`, `1.0` and
        `true` apart), scoped to this tokenizer, chat format and image pricing, and for a tool
        result to the call it answers. None without a cache, or for a message orjson cannot
        render (integers beyond 64 bits). `hashes`, when there is one per message, are hashes of
        the messages' bytes as received: equal bytes read as equal messages, so they key the
        same counts (and where a client wrote a message as orjson does, it is the same key)."""
        if self.cache is None:
            return [None] * (len(messages) - start)
        scope, dumps, results = self._scope, orjson.dumps, self._results
        if len(hashes) == len(messages):
            return [(scope, hashes[i], results.get(i)) for i in range(start, len(messages))]
        try:  # one loop with no call of ours per message: this runs for every message of every request
            return [(scope, hash(dumps(messages[i])), results.get(i)) for i in range(start, len(messages))]
        except TypeError:
            return [self._message_key(messages[i], i) for i in range(start, len(messages))]

    def _message_key(self, message: object, index: int) -> Hashable | None:
        try:
            return (self._scope, hash(orjson.dumps(message)), self._results.get(index))
        except TypeError:
            return None

    def _prefetch(self, messages: Sequence[Any]) -> None:
        """Count the large texts of the messages given in one batch (cache misses only), so that
        the encoder sees one large job it can spread over threads instead of thousands of calls."""
        floor = self.cache.min_chars if self.cache is not None else 256
        texts: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, str):
                if len(content) >= floor:
                    texts.append(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str) and len(part["text"]) >= floor:
                        texts.append(part["text"])
        if len(texts) < 2:
            return
        counts = (
            self.cache.count_many(self.tokenizer, texts) if self.cache is not None else self.tokenizer.count_many(texts)
        )
        self._prefetched = {id(t): (t, n) for t, n in zip(texts, counts, strict=True)}

    def request(self, body: Mapping[str, Any], message_hashes: Sequence[int] = ()) -> RequestCount:
        """The body's count; `message_hashes` as for `_message_keys`. With them, the counts of
        the opening it shares with a request counted before are carried (`proxy.core.openings`)."""
        recording = note_bounded_text()  # what is counted by a bound instead of encoded (proxy.core.slices)
        messages = body.get("messages")
        messages = messages if isinstance(messages, list) else []
        counts, tally = self._counts_with_openings(messages, message_hashes)
        tool_count = self._tool_definitions(body)
        format_count = response_format_tokens(body, self.tokenizer, self.fmt)
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
        )

    def _default_system(self, messages: list[Any]) -> int:
        """The template's own system turn, written when no message is a system or developer one."""
        if not self.fmt.default_system:
            return 0
        has_system = any(isinstance(m, dict) and m.get("role") in ("system", "developer") for m in messages)
        return 0 if has_system else self.fmt.default_system

    def _counts_with_openings(
        self, messages: list[Any], hashes: Sequence[int]
    ) -> tuple[tuple[MessageCount, ...], Tally]:
        """Every message's count and their sums; the tool results' contexts in `_results`. An
        opening counted before is carried with its sums (no walk over it), and this request's
        openings are kept for the next."""
        cache, n = self.cache, len(messages)
        if cache is None or len(hashes) != n or n == 0:
            self._results = result_contexts(messages)
            counts = self._count_messages(messages, hashes)
            return counts, NO_TALLY.plus(counts)
        keys: dict[int, Hashable] = {}  # each hashes a prefix of `hashes`: made only as far as looked
        opening: Opening | None = None
        for size in sizes_to_look_up(n):
            key = keys[size] = opening_key(self._scope, hashes, size)
            opening = cache.get(key)
            if opening is not None:
                break
        if opening is not None and opening.size == n:  # the very messages of a request before: a retry
            results = flag_groups(opening.contexts)
            if still_marked_alike(opening, results):  # its counts were made with these marks
                self._results = results
                return opening.counts, opening.tally
        start = opening.size if opening is not None else 0
        calls: dict[str, ResultContext] = dict(opening.calls) if opening is not None else {}
        contexts: dict[int, ResultContext] = dict(opening.contexts) if opening is not None else {}
        keep = sizes_to_keep(n)
        states: dict[int, tuple[dict[str, ResultContext], dict[int, ResultContext]]] = {}
        at = start
        for size in sorted(s for s in keep if s > start):  # the walk, paused where an opening is kept
            scan_calls(messages, at, size, calls, contexts)
            states[size], at = (dict(calls), dict(contexts)), size
        scan_calls(messages, at, n, calls, contexts)
        self._results = flag_groups(contexts)
        if opening is not None and not still_marked_alike(opening, self._results):
            opening, start = None, 0  # a result joined a parallel call of the opening: its marks moved
        carried = opening.counts if opening is not None else ()
        counts = carried + self._count_messages(messages, hashes, start)
        tally = opening.tally if opening is not None else NO_TALLY
        for size, (made, seen) in states.items():  # openings not kept before (those past the carried one)
            marked = {i: c for i, c in self._results.items() if i < size and c.group is not None}
            tally = tally.plus(counts[tally.size : size])
            key = keys.get(size) or opening_key(self._scope, hashes, size)
            cache.put(key, Opening(size, counts[:size], made, seen, marked, tally))
        return counts, tally.plus(counts[tally.size :])

    def _count_messages(
        self, messages: list[Any], hashes: Sequence[int] = (), start: int = 0
    ) -> tuple[MessageCount, ...]:
        """The count of every message from `start` on: whole messages from the cache where it
        has them, the rest counted with their large texts encoded together first."""
        keys = self._message_keys(messages, hashes, start)
        counts: list[MessageCount | None] = [None] * (len(messages) - start)
        if self.cache is not None:
            for j, hit in enumerate(self.cache.get_many(keys)):
                if hit is not None:
                    counts[j] = hit if hit.index == start + j else replace(hit, index=start + j)
        missing = [start + j for j, c in enumerate(counts) if c is None]
        self._prefetch([messages[i] for i in missing])
        try:
            for i in missing:
                count = counts[i - start] = self.message(messages[i], i)
                key = keys[i - start]
                if key is not None and self.cache is not None:
                    self.cache.put(key, count)
        finally:
            self._prefetched = {}
        return tuple(c for c in counts if c is not None)

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
            tokens = fmt.per_message + self._short(role) + (self._role_extra.get(role, 0) if self._role_extra else 0)
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
            detail = spec["detail"] if spec.get("detail") in ("low", "high", "auto") else "auto"
        # `auto` lets the provider choose; the count assumes it chooses `high`.
        cost = image_cost(url, "low" if detail == "low" else "high", self.profile.images)
        notes = []
        if cost.estimated:
            where = "a remote URL" if not url.startswith("data:") else "an unreadable data URL"
            notes.append(f"image is {where}; assumed the largest cost for detail={detail} ({cost.tokens} tokens)")
        return 0, cost.tokens, notes
