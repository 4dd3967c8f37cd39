"""What a reading of a body already knew before an adapter parses it (`KnownPrefix`): the adapters
skip the checks an earlier, accepted body with the same bytes already passed. The prefix reader
(`proxy.wire.prefix_reader`) fills it in; the adapters only read it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KnownPrefix:
    """What a reading knew of the body's array before parsing it: its first `checked` elements
    came from an earlier body that the same adapter accepted, and `hashes[i]` identifies element
    i by its bytes (every element, when the array was located; otherwise empty)."""

    checked: int = 0
    hashes: tuple[int, ...] = ()
    # Every top-level key but the array's holds the value an earlier body held, read from the same
    # bytes: an adapter that accepted that body need not check those keys again.
    others_known: bool = False
    # The body is byte for byte an earlier one, which this object stands for (an identity only):
    # what was worked out for those bytes holds for these.
    same: object | None = None
    # Its first `seen_whole` elements hold no part whose content the guard cannot see: the earlier
    # body's whole view had none (`proxy.apis.fields.unseen_parts`), so they are not looked through again.
    seen_whole: int = 0


NOTHING_KNOWN = KnownPrefix()
