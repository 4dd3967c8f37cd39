"""The parse of a body sent again as it was, kept with the earlier body it repeats.

The prefix reader finds a body that is byte for byte an earlier one before reading any of it
(`Match.same`, `proxy.wire.prefix_reader`). The reading then puts the earlier value together
again, and the adapter checks it again to the same `Parsed`: every message known, so quick, but
about 45 us on an 88 KB conversation, on every retry. The same bytes, read by the same adapter for
the same path, are the same request: once a body has been sent again, its `Parsed` (which names
the earlier body, `same_as`, as the plans kept for it are found by: `proxy.server.resent_plans`)
is kept with that body, per endpoint, and every later re-send of those bytes is that `Parsed`.

Kept while the prefix reader keeps the body (a weak reference: the reader's memory bound is this
one's), for at most `PER_BODY` endpoints per body; shared between clients as the prefix reader
is, since it saves what the reader saves, the reading (docs/security.md). A kept `Parsed` serves
requests in flight at once: nothing changes a parsed request in place (the core builds new bodies,
`outgoing` sends the request's own bytes when nothing changed).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Hashable

from proxy.apis.base import Parsed

PER_BODY = 4  # endpoints per body: a path or two that name the model


class ResentParses:
    """`Parsed` requests of bodies sent again, by the earlier body and the endpoint."""

    def __init__(self) -> None:
        self._parses: weakref.WeakKeyDictionary[object, dict[Hashable, Parsed]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # large bodies are parsed in threads

    def get(self, earlier: object, endpoint: Hashable) -> Parsed | None:
        """The `Parsed` kept for `earlier`'s bytes at `endpoint`, if any."""
        with self._lock:
            kept = self._parses.get(earlier)
            return kept.get(endpoint) if kept is not None else None

    def keep(self, parsed: Parsed, endpoint: Hashable) -> None:
        """Keep `parsed`, a body sent again (its `same_as` set), for the next time its bytes come."""
        earlier = parsed.same_as() if parsed.same_as is not None else None
        if earlier is None:
            return
        with self._lock:  # the kept `Parsed` names its body weakly: it does not keep the body alive
            kept = self._parses.setdefault(earlier, {})
            if len(kept) < PER_BODY:
                kept.setdefault(endpoint, parsed)

    def __len__(self) -> int:
        with self._lock:
            return sum(len(kept) for kept in self._parses.values())
