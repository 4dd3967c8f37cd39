"""The adapter protocol: every API shape the guard counts, seen by the core as chat completions.

The core (`proxy.core`) counts, budgets and trims chat-completions bodies and knows no other
shape. An adapter stands at the edge between a client's API and the core:

    parse(body)          -> Parsed: the body validated, its chat-completions view (messages, tools,
                            response_format, the output reserve, model) and where each view message
                            came from
    render(parsed, ...)  -> the cut written back into the ORIGINAL shape: dropped view messages drop
                            their items, shortened ones replace only their text, messages the trim
                            added go where they stand in the view; everything else is kept as sent
    error_body(error)    -> an error in the API's own shape (and `overflow_refusal`: the guard's
                            refusal worded as the shape's provider words an overflow)
    broken_stream_event  -> the event that ends a broken stream; `stream_framing`: a stream's own;
                            `answer_usage`: an answer's usage in the shape's own spelling
    profile, pipeline    -> the profile as this API counts it; strategies replacing the pipeline
    edited(parsed, c, g) -> the request once the context edits it asks the provider for ran

`proxy.apis.fitting.fit()` runs a parsed request through the core and renders the result. Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol

from proxy.apis.fields import NOTHING_KNOWN, KnownPrefix, unread_fields
from proxy.apis.stream_errors import StreamFraming, openai_broken
from proxy.core.counting.request_count import RequestCounter
from proxy.core.counting.tokenizer import Tokenizer
from proxy.core.models.model_registry import ModelProfile
from proxy.core.plan import InvalidBody
from proxy.core.trimming.budget import Removal, TrimResult
from proxy.core.trimming.trim import Strategy
from proxy.errors import GuardError


class InvalidRequest(InvalidBody):
    """A body this API does not accept; `param` names the field as the API spells it (`input[3].call_id`)."""


@dataclass(frozen=True, slots=True)
class Origin:
    """One place in the original body: `field` (`input`, `messages`, `instructions`, `system`,
    `prompt`), the item's position in it (None for a scalar field) and, for an item split into
    several view messages, the block inside the item (None: the whole item)."""

    field: str
    index: int | None = None
    block: int | None = None

    def __str__(self) -> str:
        where = self.field if self.index is None else f"{self.field}[{self.index}]"
        return where if self.block is None else f"{where}.content[{self.block}]"


@dataclass(frozen=True, slots=True)
class Source:
    """Where one view message came from: its origins, and for each of its content parts the
    position of the original part or block it mirrors (None for a part the view added)."""

    origins: tuple[Origin, ...]
    parts: tuple[int | None, ...] = ()


@dataclass(frozen=True, slots=True)
class HeldContext:
    """Context the provider holds and puts in the prompt, named by id."""

    kind: str  # "response", "conversation", "cache" (Gemini's cachedContent) or "interaction"
    id: str


class ViewBuilder:
    """The chat view as an adapter builds it: messages, their sources, estimates, held context."""

    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []
        self.sources: list[Source] = []
        self.notes: list[str] = []
        self.exact = True
        self.server_state = False  # `Parsed.server_state`
        self.held: list[HeldContext] = []  # `Parsed.held`

    def add(self, message: dict[str, Any], origins: Sequence[Origin], parts: Sequence[int | None] = ()) -> None:
        self.messages.append(message)
        self.sources.append(Source(tuple(origins), tuple(parts)))

    def estimate(self, note: str) -> None:
        self.exact = False
        self.notes.append(note)

    def provider_holds(self, note: str, held: HeldContext | None = None) -> None:
        """Part of the context lives on the provider (`Parsed.server_state`), named by `held`."""
        self.server_state = True
        self.held += [held] if held is not None else []
        self.estimate(note)

    def parsed(
        self,
        adapter: Adapter,
        body: Mapping[str, Any],
        chat: Mapping[str, Any],
        model: str | None,
        fixed_tokens: int = 0,
    ) -> Parsed:
        """The `Parsed` of `body` whose chat view this builder built for `adapter`: its sources,
        whether it is exact, its notes and server state, and what the adapter's API shape says
        (its name, the top-level fields it accounts for, where its output reserve sits)."""
        return Parsed(
            api=adapter.name,
            body=body,
            chat=chat,
            sources=tuple(self.sources),
            model=model,
            stream=stream_flag(body),
            server_state=self.server_state,
            exact=self.exact,
            fixed_tokens=fixed_tokens,
            notes=tuple(self.notes),
            reserve_field=adapter.reserve_field,
            reserve_view_field=adapter.reserve_view_field,
            unread=unread_fields(body, adapter.accounted),
            held=tuple(self.held),
        )


@dataclass(frozen=True)
class Parsed:
    """A validated request: as received (`body`), and the chat-completions view of it (`chat`)
    that the core counts and trims, one `Source` per view message."""

    api: str
    body: Mapping[str, Any]
    chat: Mapping[str, Any]
    sources: tuple[Source, ...]
    model: str | None
    stream: bool = False
    server_state: bool = False  # part of the context lives on the provider and is not counted
    exact: bool = True  # False when some part was estimated (opaque items, built-in tools)
    fixed_tokens: int = 0  # tokens the API adds that no view message carries
    notes: tuple[str, ...] = ()
    reserve_field: str | None = None  # the original field holding the output reserve
    reserve_view_field: str | None = None  # the view's field for it (max_completion_tokens, max_tokens)
    private: Mapping[str, Any] = field(default_factory=dict)  # what an adapter keeps for render
    # A count cache key per view message (its bytes' hash), when they are the body's own (chat) and
    # were located, else empty; and how many an earlier body held in the same bytes (`KnownPrefix.checked`).
    message_hashes: tuple[int, ...] = ()
    shared_messages: int = 0
    # Top-level fields the adapter neither counts nor knows to stay out of the prompt (`proxy.apis.fields`).
    unread: tuple[str, ...] = ()
    # Parts whose content the provider reads but the guard cannot see nor bound (`proxy.apis.fields.unseen_parts`).
    unseen: tuple[str, ...] = ()
    # Context the provider holds that this request names by id (`HeldContext`), in body order.
    held: tuple[HeldContext, ...] = ()
    # The earlier body these exact bytes are, when the reader knew it (`KnownPrefix.same`), weakly: the
    # request and plan made for it may be this one's (`proxy.wire.readers`).
    same_as: Callable[[], object | None] | None = field(default=None, compare=False, repr=False)

    @property
    def read_whole(self) -> bool:
        """Whether everything the upstream may put in the prompt was counted exactly or bounded, no
        part estimated: what it says about this request (a count, its usage) may be learned."""
        return self.exact and not self.unread and not self.server_state and not self.unseen

    @property
    def messages(self) -> list[Any]:
        messages = self.chat.get("messages")
        return messages if isinstance(messages, list) else []

    def where(self, index: int) -> str:
        """The original location(s) of view message `index`, for log lines (no content)."""
        if not 0 <= index < len(self.sources):
            return ""
        return ",".join(str(origin) for origin in self.sources[index].origins)

    def with_model(self, model: str | None) -> Parsed:
        return self if model is None or self.model else replace(self, model=model)


@dataclass(frozen=True)
class Changes:
    """What trimming did to the view: view messages dropped or replaced (shortened), the reserve lowered."""

    dropped: frozenset[int]
    replaced: Mapping[int, Mapping[str, Any]]
    reserve: int | None
    # Messages the trim added (the budget note, a summary), each with the view index of the
    # original message it goes before (the number of view messages when it goes last).
    inserted: tuple[tuple[int, Mapping[str, Any]], ...] = ()

    @property
    def none(self) -> bool:
        return not self.dropped and not self.replaced and self.reserve is None and not self.inserted


def changes_of(
    parsed: Parsed, trimmed: Mapping[str, Any], removals: Iterable[Removal], inserted: Sequence[int] = ()
) -> Changes:
    """Compare the trimmed view with the parsed one: the trimmed `messages`, less the `inserted`
    positions, are the kept view messages in order, so each pairs with the first index that was
    not dropped."""
    dropped = frozenset(r.index for r in removals if r.kind == "dropped" and r.index is not None)
    original = parsed.messages
    kept = [i for i in range(len(original)) if i not in dropped]
    trimmed_messages = trimmed.get("messages")
    trimmed_messages = trimmed_messages if isinstance(trimmed_messages, list) else []
    added = set(inserted)
    new = [m for j, m in enumerate(trimmed_messages) if j not in added]
    if len(new) != len(kept):
        raise ValueError(f"trimmed view has {len(new)} messages where {len(kept)} were kept")
    replaced = {i: m for i, m in zip(kept, new, strict=True) if m != original[i]}
    placed = []
    for j in sorted(added):
        following = j - sum(1 for a in added if a < j)  # kept view messages before it
        placed.append((kept[following] if following < len(kept) else len(original), trimmed_messages[j]))
    reserve = None
    key = parsed.reserve_view_field
    if key is not None and trimmed.get(key) != parsed.chat.get(key):
        value = trimmed.get(key)
        reserve = value if isinstance(value, int) else None
    return Changes(dropped, replaced, reserve, tuple(placed))


class Adapter:
    """One API shape. Subclasses implement `parse` and `_render`; the rest defaults to OpenAI's ways."""

    name: ClassVar[str] = ""
    # Whether `_render` writes the messages a trim adds (the budget note, a summary) in this shape.
    writes_inserted: ClassVar[bool] = False
    # The top-level array a client re-sends with every request (`proxy.wire.prefix_reader`), if any.
    resent_array: ClassVar[str | None] = None
    # The top-level fields the adapter reads or knows to stay out of the prompt (`proxy.apis.fields`).
    accounted: ClassVar[frozenset[str]] = frozenset()
    # Where the output reserve sits in the original body and in the chat view (None: it depends on
    # the request, as chat's `max_tokens` or `max_completion_tokens`, and `Parsed` says).
    reserve_field: ClassVar[str | None] = None
    reserve_view_field: ClassVar[str | None] = None
    # The body sent upstream is the chat view the core counts (chat completions): a backend's
    # tokenizer can count a cut body again, and the prompt tokens an answer reports measure what
    # the core counted, so an estimate may learn from them (calibration).
    body_is_view: ClassVar[bool] = False

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        """The request as this API reads it. `known` says which leading elements of the re-sent
        array this adapter accepted before, in an earlier body (their checks need not run again)."""
        raise NotImplementedError

    def render(
        self, parsed: Parsed, trimmed: Mapping[str, Any], removals: Sequence[Removal], inserted: Sequence[int] = ()
    ) -> dict[str, Any]:
        """The cut, written back into the original shape. Unchanged requests come back equal to
        the body as received."""
        changes = changes_of(parsed, trimmed, removals, inserted)
        if changes.none:
            return dict(parsed.body)
        body = self._render(parsed, changes)
        if changes.reserve is not None:
            self.write_reserve(body, parsed, changes.reserve)
        return body

    def _render(self, parsed: Parsed, changes: Changes) -> dict[str, Any]:
        raise NotImplementedError

    def write_reserve(self, body: dict[str, Any], parsed: Parsed, reserve: int) -> None:
        """The output reserve a trim lowered, written where this API keeps it (a top-level field here)."""
        if parsed.reserve_field is not None:
            body[parsed.reserve_field] = reserve

    def error_body(self, error: GuardError) -> dict[str, Any]:
        """`error` in the API's own shape: OpenAI's, unless the shape has its own."""
        return error.to_openai()

    def error_headers(self, error: GuardError) -> dict[str, str]:
        """Headers the shape's errors carry beside their body (Bedrock names its exception in one)."""
        return {}

    def overflow_refusal(self, result: TrimResult) -> tuple[str, str | None]:
        """The guard's refusal of `result` worded as this shape's provider words its own overflow
        (so clients classify it as one), and the parameter it names: OpenAI's, unless the shape
        has its own (`proxy.errors.ContextLengthExceeded.refused`)."""
        return result.rejection_message(result.openai_overflow()), "messages"

    def broken_stream_event(self, message: str) -> bytes:
        """The event that tells this shape's client its stream broke (`proxy.apis.stream_errors`)."""
        return openai_broken(message)

    def stream_framing(self, content_type: str) -> StreamFraming | None:
        """A streamed answer of `content_type` in a framing of the shape's own; None: SSE's."""
        return None

    def answer_usage(self, payload: Mapping[str, Any]) -> tuple[int, int | None, int | None] | None:
        """The usage an answer (or streamed event) reports where the shape spells it as no other does:
        (prompt with its cached part, output, cached part); None: as `proxy.server.upstream.usage` reads."""
        return None

    def profile(self, profile: ModelProfile, parsed: Parsed) -> ModelProfile:
        """The profile this request is counted with: the API's fixed overheads in the reply priming."""
        if not parsed.fixed_tokens:
            return profile
        fmt = profile.chat_format
        return replace(profile, chat_format=replace(fmt, reply_priming=fmt.reply_priming + parsed.fixed_tokens))

    def pipeline(self, parsed: Parsed) -> tuple[Strategy, ...] | None:
        """Strategies that replace the configured pipeline for this request; None keeps it."""
        return None

    def edited(self, parsed: Parsed, counter: RequestCounter, by_guard: bool) -> EditedRequest | None:
        """The request once the edits it asks the provider for have run, counted with `counter`;
        `by_guard`: the upstream cannot run them, the guard does. None: it asks for none."""
        return None

    def count_answer(self, answer: Mapping[str, Any], original_tokens: int | None) -> Mapping[str, Any]:
        """A local count endpoint's `answer`, with what the API adds to it: the count before the
        edits the request asks the provider for (`original_tokens`; None: it asks for none)."""
        return answer

    def answer_amendment(self, fields: Mapping[str, Any], stream: bool) -> AnswerAmendment | None:
        """What writes `fields` (`EditedRequest.answer`) into the provider's answer, a stream's or
        a whole body's; None: this API has nowhere to put them."""
        return None

    def counted_view(self, parsed: Parsed, tokenizer: Tokenizer) -> Mapping[str, Any]:
        """The chat view the core counts, once the tokenizer is known (`parsed.chat` unless the
        view depends on counts)."""
        return parsed.chat


class AnswerAmendment(Protocol):
    """Fields written into a provider's answer as it is relayed: each chunk fed in comes out
    amended (b"" while held back), and `finish` gives what is still held at its end."""

    def feed(self, chunk: bytes) -> bytes: ...

    def finish(self) -> bytes: ...


@dataclass(frozen=True)
class EditedRequest:
    """A request once the edits it asks its provider for ran (`Adapter.edited`): `parsed` is counted
    and cut; `send`, the body to send when it fits (None: as received, the provider edits it); its
    count before the edits (None: nothing cleared); `answer`, fields the guard adds to the answer."""

    parsed: Parsed
    original_tokens: int | None
    send: Mapping[str, Any] | None = None
    answer: Mapping[str, Any] | None = None


def require_object(body: object) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise InvalidRequest(f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def optional_model(body: Mapping[str, Any], required: bool) -> str | None:
    model = body.get("model")
    if model is None and not required:
        return None
    if not isinstance(model, str) or not model:
        raise InvalidRequest("'model' is required and must be a non-empty string", param="model")
    return model


def output_reserve(body: Mapping[str, Any], key: str, required: bool = False) -> int | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(f"'{key}' must be a positive integer", param=key)
    return value


def stream_flag(body: Mapping[str, Any]) -> bool:
    return body.get("stream") is True


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def opaque_part(value: object) -> dict[str, Any]:
    """A part the core counts as its JSON and never shortens."""
    return {"type": "item", "item": value}


def shortened_texts(old: Sequence[Any], new: Sequence[Any]) -> list[tuple[int, str]]:
    """The position and new text of each part the trim rewrote as a text (shortened, or a marker
    in place of an image); none when the two lists do not pair up one to one."""
    if len(old) != len(new):
        return []
    changed = (j for j, (a, b) in enumerate(zip(old, new, strict=True)) if a != b)
    return [(j, text) for j in changed if (text := _text(new[j])) is not None]


def _text(part: object) -> str | None:
    if isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str):
        return str(part["text"])
    return None
