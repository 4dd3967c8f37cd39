"""Chat completions: the core's own shape, so the view is the body itself.

Parsing checks every field the core reads (`proxy.wire.readers`: `messages`, each an object with a
string `role`, tools, tool calls, content parts, token limits; a string `model` when present:
Azure deployments name the model in the path instead). Rendering returns the trimmed body, which
the core already built with every other field kept.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from proxy.apis import fields
from proxy.apis.base import Adapter, InvalidRequest, Origin, Parsed, Source, optional_model, stream_flag
from proxy.apis.endpoints import Endpoint, Shape, ShapeOptions
from proxy.apis.fields import unread_fields
from proxy.apis.known import NOTHING_KNOWN, KnownPrefix
from proxy.apis.openai.chat_checks import check_chat_body
from proxy.core.plan import InvalidBody
from proxy.core.trimming.trim import Removal

# Every chat request of n messages has the same n sources: built once for the first few thousand
# indices (a few hundred KB at most) and sliced per request. Grown by rebinding, never in place,
# so a parse on another thread (a large body) always sees a consistent tuple.
_SOURCES_KEPT = 4096
_sources: tuple[Source, ...] = ()


def message_sources(count: int) -> tuple[Source, ...]:
    """`messages[i]` is where view message i came from, for i < count."""
    global _sources
    kept, sources = min(count, _SOURCES_KEPT), _sources
    if len(sources) < kept:
        sources = _sources = sources + tuple(Source((Origin("messages", i),)) for i in range(len(sources), kept))
    head = sources[:kept]
    return head if kept == count else head + tuple(Source((Origin("messages", i),)) for i in range(kept, count))


class ChatAdapter(Adapter):
    name: ClassVar[str] = "chat"
    body_is_view: ClassVar[bool] = True
    writes_inserted: ClassVar[bool] = True
    resent_array: ClassVar[str | None] = "messages"
    accounted: ClassVar[frozenset[str]] = fields.CHAT  # the output reserve's field is the body's: `Parsed` says

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        try:
            checked = check_chat_body(
                body, require_model=False, checked_messages=known.checked, checked_others=known.others_known
            )
        except InvalidBody as exc:
            raise InvalidRequest(str(exc), param=exc.param) from None
        model = optional_model(checked, required=False)
        messages = checked["messages"]
        hashes = known.hashes if len(known.hashes) == len(messages) else ()
        reserve = "max_completion_tokens" if "max_completion_tokens" in checked else "max_tokens"
        return Parsed(
            api=self.name,
            body=checked,
            chat=checked,
            sources=message_sources(len(messages)),
            model=model,
            stream=stream_flag(checked),
            reserve_field=reserve,
            reserve_view_field=reserve,
            message_hashes=hashes,
            shared_messages=known.checked if hashes else 0,
            unread=unread_fields(checked, self.accounted),
            same_as=weakref.ref(known.same) if hashes and known.same is not None else None,
        )

    def render(
        self, parsed: Parsed, trimmed: Mapping[str, Any], removals: Sequence[Removal], inserted: Sequence[int] = ()
    ) -> dict[str, Any]:
        """The core trimmed the body itself, every other field kept, and may have added messages
        (the budget note): the trimmed body is the answer."""
        return dict(trimmed)


CHAT_PATHS = ("/v1/chat/completions", "/chat/completions", "/openai/v1/chat/completions")
_AZURE_CHAT = re.compile(r"/openai/deployments/(?P<deployment>[^/]+)/chat/completions")


def shape(options: ShapeOptions) -> Shape:
    """Chat Completions, at OpenAI's paths and an Azure deployment's (its model: the deployment)."""
    adapter = ChatAdapter()
    endpoint = Endpoint(adapter)

    def deployment(path: str) -> Endpoint | None:
        found = _AZURE_CHAT.fullmatch(path)
        return Endpoint(adapter, path_model=found["deployment"]) if found else None

    return Shape(adapter.name, (adapter,), dict.fromkeys(CHAT_PATHS, endpoint), deployment, _generates)


def _generates(segments: tuple[str, ...]) -> bool:
    return segments[-2:] == ("chat", "completions")
