"""A large body parsed with its long strings decoded a slice at a time, not in one orjson call.

`orjson.loads` holds the GIL for its whole run: 50-80 ms on a 31 MiB body, during which the event
loop (which answers `/livez` and every small request) waits each time it needs the GIL back. Most
of a large body is usually a few long strings (a pasted document, a base64 image), so
`sliced_loads` finds them first (`long_strings`: a scan of at most `SCAN_BYTES` per regex call),
parses the body with each of them replaced by a short placeholder (the skeleton, small), decodes
each long string in pieces of about `PIECE_BYTES` (each piece a JSON string of its own, cut
where no escape or UTF-8 character spans the cut), and puts the strings back where their
placeholders are. orjson checks every piece as it would the whole string (UTF-8, escapes,
control characters, surrogates): the value is `orjson.loads(raw)`'s, and a body it would refuse
is refused too (the caller's exact pass says why).

Only ASCII string values are taken out (never a key: a key stays in the skeleton, so that a
duplicate is seen as before). Memory sets that bound: while its pieces are joined a string is held
twice, which the per-body bound of docs/security.md allows for ASCII (a 30 MB prose body peaked
at 92 MB, bound 106) but not for text of two or three bytes a character, whose counting holds
more (CJK: 112 MB, bound 106). A body of many small values, a non-ASCII long string and a string
no cut fits in (all escapes) are parsed in one call, as before.
"""

from __future__ import annotations

import os
import re
from typing import Any

import orjson

from proxy.core.slices import SLICE_BYTES, contains, count

LONG_STRING_BYTES = 256 * 1024  # a string at least this long is decoded in pieces
PIECE_BYTES = SLICE_BYTES
SCAN_BYTES = 256 * 1024  # a regex call scans at most this much: about a millisecond
# From a position outside any string: everything up to the next string that does not close before
# the scan's end (or up to the end). Possessive: nothing is tried twice.
_OUTSIDE = re.compile(rb'(?:[^"]++|"[^"\\]*+(?:\\.[^"\\]*+)*+")*+')
# From just inside a string: its characters up to its closing quote (not taken) or the scan's end.
_INSIDE = re.compile(rb'[^"\\]*+(?:\\.[^"\\]*+)*+')
_SPACE = re.compile(rb"[ \t\r\n]*+")
# Where a piece may end: after six bytes with no backslash (no escape, `\uXXXX` the longest, spans
# the cut, nor a surrogate pair) and before a byte that is neither a backslash nor a UTF-8
# continuation byte (no character spans it).
_CUT = re.compile(rb"[^\\]{6}[^\\\x80-\xbf]")


def long_strings(raw: bytes, at_least: int = LONG_STRING_BYTES) -> list[tuple[int, int]] | None:
    """The string values of `raw` of at least `at_least` bytes, as (offset of the opening quote,
    offset after the closing one), in order; None when a string does not close (not JSON)."""
    found: list[tuple[int, int]] = []
    pos, size = 0, len(raw)
    while pos < size:
        pos = _OUTSIDE.match(raw, pos, min(size, pos + SCAN_BYTES)).end()  # type: ignore[union-attr]  # matches empty
        if pos >= size or raw[pos] != 0x22:  # the end, or the scan's end outside a string: go on
            continue
        start, pos = pos, pos + 1
        while True:  # inside the string, a scan at a time
            end = _INSIDE.match(raw, pos, min(size, pos + SCAN_BYTES)).end()  # type: ignore[union-attr]
            if end >= size or (end == pos and raw[end] != 0x22):  # no closing quote, or a lone backslash last
                return None
            pos = end
            if raw[pos] == 0x22:
                break
        pos += 1
        if pos - start >= at_least and not _is_key(raw, pos):
            found.append((start, pos))
    return found


def _is_key(raw: bytes, after: int) -> bool:
    """Whether the string that ends just before `after` is a key (a colon follows it)."""
    colon = _SPACE.match(raw, after).end()  # type: ignore[union-attr]  # matches empty
    return raw[colon : colon + 1] == b":"


def sliced_loads(raw: bytes) -> tuple[Any, bool]:
    """`orjson.loads(raw)` with its long strings decoded a piece at a time, and whether orjson
    kept every key it read: as many colons written outside the long strings as in its writing
    back of what it read (a colon inside a string is in both, unless escaped: the caller looks for
    `\\u003` itself). Raises `orjson.JSONDecodeError` where `orjson.loads` would."""
    spans = [(start, end) for start, end in long_strings(raw) or () if _ascii(raw, start, end)]
    nonce = os.urandom(8).hex().encode()
    if not spans or contains(raw, nonce):  # none (or not JSON), or a placeholder could be taken for a string of it
        value = orjson.loads(raw)
        return value, _keys_kept(raw, value)
    parts: list[bytes] = []
    at = 0
    for i, (start, end) in enumerate(spans):
        parts += (raw[at:start], b'"\\u0000' + nonce + b'%d"' % i)
        at = end
    parts.append(raw[at:])
    skeleton = b"".join(parts)
    value = orjson.loads(skeleton)
    keys_kept = _keys_kept(skeleton, value)
    strings = {f"\x00{nonce.decode()}{i}": _decoded(raw, start + 1, end - 1) for i, (start, end) in enumerate(spans)}
    return _put_back(value, strings), keys_kept


def _keys_kept(read: bytes, value: Any) -> bool:
    """Whether orjson kept every key of `read` in `value`: as many colons in `read` as in `value`
    written back. False when `value` nests past what orjson writes back (254 levels, deeper than
    any body is allowed): the caller's depth check refuses such a body anyway."""
    try:
        return count(read, b":") == orjson.dumps(value).count(b":")
    except orjson.JSONEncodeError:
        return False


def _ascii(raw: bytes, start: int, end: int) -> bool:
    """Whether `raw[start:end]` is ASCII, a slice at a time."""
    return all(raw[at : min(end, at + SLICE_BYTES)].isascii() for at in range(start, end, SLICE_BYTES))


def _decoded(raw: bytes, start: int, end: int) -> str:
    """The JSON string whose text (quotes left out) is `raw[start:end]`, a piece at a time."""
    pieces = []
    while end - start > PIECE_BYTES:
        cut = _cut(raw, start + PIECE_BYTES - 7, end)
        if cut is None:
            break
        pieces.append(orjson.loads(b'"' + raw[start:cut] + b'"'))
        start = cut
    pieces.append(orjson.loads(b'"' + raw[start:end] + b'"'))
    return "".join(pieces)


def _cut(raw: bytes, start: int, end: int) -> int | None:
    """The first place from `start` on where a piece of a string ending at `end` may end, each
    search over at most a piece's length (windows overlap so a match across two is found)."""
    while start < end:
        found = _CUT.search(raw, start, min(end, start + PIECE_BYTES))
        if found is not None:
            return found.end() - 1
        start += PIECE_BYTES - 6
    return None


def _put_back(value: Any, strings: dict[str, str]) -> Any:
    """`value` with each placeholder string that is a value in it replaced by its string."""
    if type(value) is str:
        return strings.get(value, value)
    left, stack = len(strings), [value]
    while stack and left:
        container = stack.pop()
        items = container.items() if type(container) is dict else enumerate(container)
        for key, item in items:
            if type(item) is str:
                if item in strings:
                    container[key] = strings[item]
                    left -= 1
            elif type(item) is dict or type(item) is list:
                stack.append(item)
    return value
