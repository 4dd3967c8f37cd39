"""The readers of the bodies each adapter receives: strict JSON (`proxy.wire.strict_json`), and a
conversation sent again parsed only where it is new (`proxy.wire.prefix_reader`, keeping
`prefix_memory_bytes` of earlier bodies per adapter, 0 for none)."""

from __future__ import annotations

from collections.abc import Iterable

from proxy.apis.base import Adapter
from proxy.wire.prefix_reader import Match, PrefixReader, Reading
from proxy.wire.strict_json import DEFAULT_LIMITS, JsonLimits


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
        """A body sent again whose parse was kept (`proxy.server.request.resent`): the earlier body is
        the most recently used again, as `accepted` makes it for a body read."""
        if match.same and match.earlier is not None:
            self.accepted(adapter, Reading(None, body=match.earlier))

    def accepted(self, adapter: Adapter, reading: Reading, seen_whole: bool = False) -> None:
        """`adapter` accepted the body read (`seen_whole`: its view has no part the guard cannot
        see): a later body may build on it."""
        reader = self._readers.get(adapter.name)
        if reader is not None:
            reader.keep(reading, seen_whole)
