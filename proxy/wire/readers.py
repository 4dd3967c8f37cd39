"""The readers of the bodies each adapter receives, and what is kept for a body sent again as it
was: strict JSON (`proxy.wire.codec`), a conversation sent again parsed only where it is new
(`proxy.wire.prefix_reader`, keeping `prefix_memory_bytes` of earlier bodies per adapter, 0 for
none), a request's body read and parsed by its endpoint's adapter (`parsed_request`), and a
chat-completions body read and type-checked in one call (`read_chat_body`: the echo upstream and
the tools).

A retry, or a regenerated answer, sends the very bytes of an earlier request. The prefix reader
knows when it does before reading any of them (the match's `same`, the reading's
`KnownPrefix.same`, which the request names weakly as `Parsed.same_as`), and what was worked out
for those bytes holds for these:

- **The request** (`Parsed`): the same bytes, read by the same adapter for the same path, are the
  same request. Reading them again put the earlier value together and the adapter checked it
  again to the same `Parsed`. Once a body has been sent again, its `Parsed` is kept, per endpoint
  (a path may name the model), and every later re-send of those bytes is that `Parsed`. Shared
  between clients as the prefix reader is: it saves what the reader saves, the reading
  (docs/security.md). A kept `Parsed` serves requests in flight at once: nothing changes a parsed
  request in place (the core builds new bodies; `outgoing` sends the request's own bytes when
  nothing changed).
- **The plan**, for the same client, model, window, tokenizer and policy: counting the bytes again
  would find every count in the cache and reach the same decision. Only a plan that cut nothing:
  a cut plan carries the counter that counts a summary put in later, which is one request's own.
  Kept per client, as the count cache is, so that one client's timing cannot tell it what another
  sent. Each use is noted on the plan's timings: the count took the lookup's time, the trim none.

Both are kept only while the prefix reader keeps the body (a weak reference: the reader's memory
bound is theirs too), a few per body; and neither keeps the body alive (a `Parsed` names it weakly,
and of a `Fitted` only the plan is kept).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Generic, TypeVar

from proxy.apis.base import Adapter, Parsed
from proxy.apis.fitting import Fitted
from proxy.apis.openai.chat import check_chat_body
from proxy.apis.registry import Endpoint
from proxy.core.plan import Plan
from proxy.wire.codec import DEFAULT_LIMITS, JsonLimits, read_json
from proxy.wire.prefix_reader import Match, PrefixReader, Reading


def read_chat_body(raw: bytes, limits: JsonLimits = DEFAULT_LIMITS, *, require_model: bool = True) -> dict[str, Any]:
    """The body of a chat-completions request, checked; UnreadableJson (not JSON, or ambiguous) or
    InvalidBody (a field of the wrong type) saying what is wrong (`proxy.server.edge.body` maps both)."""
    return check_chat_body(read_json(raw, limits), require_model=require_model)


V = TypeVar("V")

PARSES_PER_BODY = 4  # endpoints per body: a path or two that name the model
PLANS_PER_BODY = 8  # plans per body: a few clients, windows or tokenizers


def parsed_request(
    readers: BodyReaders, parses: KeptPerBody[Parsed], endpoint: Endpoint, raw: bytes, match: Match | None = None
) -> Parsed:
    """The body read strictly (duplicate keys, depth, encoding) and parsed by its endpoint's
    adapter (the chat adapter type-checks every field the core reads); a conversation re-sent with
    a new turn is read and checked only where it is new (`match`: the prefix reader's), and a body
    sent again as it was is the request parsed the last time (`parses`). A bad body raises the
    layer's own error (`BodyError`), which the server turns into its 400."""
    if match is not None and match.same:
        kept = parses.get(match.earlier, endpoint)
        if kept is not None:
            readers.used_again(endpoint.adapter, match)
            return kept
    reading = readers.read(endpoint.adapter, raw, match)
    parsed = endpoint.parse(reading.value, reading.known)
    readers.accepted(endpoint.adapter, reading, seen_whole=not parsed.unseen)
    parses.put(earlier_body(parsed), endpoint, parsed)  # a body sent again: its request, for the next time
    return parsed


def earlier_body(parsed: Parsed) -> object | None:
    """The earlier body `parsed`'s bytes are, while the prefix reader keeps it; else None."""
    return parsed.same_as() if parsed.same_as is not None else None


class KeptPerBody(Generic[V]):
    """Values kept with earlier bodies, under keys, at most `per_body` per body, for as long as
    each body lives elsewhere (the prefix reader)."""

    def __init__(self, per_body: int) -> None:
        self.per_body = per_body
        self._kept: weakref.WeakKeyDictionary[object, dict[Hashable, V]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # used on the loop and in threads

    def get(self, body: object, key: Hashable) -> V | None:
        """The value kept with `body` under `key`, or None."""
        with self._lock:
            kept = self._kept.get(body)
            return kept.get(key) if kept is not None else None

    def put(self, body: object | None, key: Hashable, value: V) -> None:
        """Keep `value` with `body` under `key` (nothing without a body, or once it holds `per_body`)."""
        if body is None:
            return
        with self._lock:
            kept = self._kept.setdefault(body, {})
            if len(kept) < self.per_body:
                kept.setdefault(key, value)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(kept) for kept in self._kept.values())


class ResentPlans:
    """Plans of bodies sent again, by the earlier body and what else the plan depended on."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        # A plan, with the count before the context edits the request asks for (`Fitted.original_tokens`).
        self._plans: KeptPerBody[tuple[Plan, int | None]] = KeptPerBody(PLANS_PER_BODY)

    def fitted(self, parsed: Parsed, key_of: Callable[[], Hashable], make: Callable[[], Fitted]) -> Fitted:
        """The plan kept for `parsed`'s earlier body and `key_of()` (what else the plan depended
        on), for `parsed`; else `make()`, kept when it may be. A body not sent before is only
        made: its key is never worked out."""
        same = earlier_body(parsed)
        if same is None:
            return make()
        started = self._clock()
        key = key_of()
        kept = self._plans.get(same, key)
        if kept is not None:
            plan, original = kept
            body = plan.request if plan.rewritten else parsed.body  # the edits the guard made, made again
            return Fitted(parsed, plan.again(body, self._clock() - started), body, original)
        fitted = make()
        if not fitted.plan.result.changed:
            self._plans.put(same, key, (fitted.plan, fitted.original_tokens))
        return fitted

    def __len__(self) -> int:
        return len(self._plans)


class BodyReaders:
    """One prefix reader per adapter that names the array its bodies re-send."""

    def __init__(
        self, adapters: Iterable[Adapter] = (), limits: JsonLimits = DEFAULT_LIMITS, prefix_memory_bytes: int = 0
    ) -> None:
        self._readers = {
            adapter.name: PrefixReader(adapter.resent_array, limits, max_bytes=prefix_memory_bytes)
            for adapter in adapters
            if adapter.resent_array is not None
        }
        self._plain = PrefixReader("", limits, max_bytes=0)

    def match(self, adapter: Adapter, raw: bytes) -> Match:
        """What the body shares with earlier ones `adapter` accepted (`PrefixReader.match`)."""
        return self._readers.get(adapter.name, self._plain).match(raw)

    def read(self, adapter: Adapter, raw: bytes, match: Match | None = None) -> Reading:
        """The body strictly read for `adapter` (`read_json`'s value and errors)."""
        return self._readers.get(adapter.name, self._plain).read(raw, match)

    def used_again(self, adapter: Adapter, match: Match) -> None:
        """A body sent again whose parse was kept (`KeptPerBody`): the earlier body is
        the most recently used again, as `accepted` makes it for a body read."""
        if match.same and match.earlier is not None:
            self.accepted(adapter, Reading(None, body=match.earlier))

    def accepted(self, adapter: Adapter, reading: Reading, seen_whole: bool = False) -> None:
        """`adapter` accepted the body read (`seen_whole`: its view has no part the guard cannot
        see): a later body may build on it."""
        reader = self._readers.get(adapter.name)
        if reader is not None:
            reader.keep(reading, seen_whole)
