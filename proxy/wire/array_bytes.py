"""Where a body's array elements sit in its bytes, and how many of them a new body shares with an
earlier one: the byte-level half of the prefix reader (`proxy.wire.prefix_reader` reads, reuses
and keeps the bodies; this module only compares and locates bytes, and parses nothing).

A body read in full is located once (`located_body`): where its array opens under the top-level
key, where each element ends and a hash of each element's bytes. A new body is then compared with
a located one in place (`shared_elements`), element by element from the end back, so that the
common case (the same conversation with a turn added) costs a few comparisons of bytes whatever
the body's size. The element hashes key the count cache: equal bytes read as equal messages
(`proxy.core.counting.request_count.digest`, which `proxy.core.counting.request_count` takes of a message's
compact JSON too, so that one written compactly has one key either way).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core.counting.request_count import digest

# Brackets outside strings, each with where it is; strings and everything else are skipped in C.
_BRACKET = re.compile(rb'(?:[^"{}\[\]]++|"[^"\\]*+(?:\\.[^"\\]*+)*+")*+([{}\[\]])', re.S)
_KEY = re.compile(rb'"[^"\\]*+(?:\\.[^"\\]*+)*+"|[{}\[\]]', re.S)
_COLON_BRACKET = re.compile(rb"\s*:\s*\[")
_SEPARATOR = re.compile(rb"\s*,?\s*")  # before an element: a comma, except before the first
_CLOSE = re.compile(rb"\s*\]")

# Each element's end offset, each element's hash, and the offset of the array's `]`.
Spans = tuple[tuple[int, ...], tuple[int, ...], int]


@dataclass(frozen=True, eq=False)  # one body is itself, not any body of equal bytes
class LocatedBody:
    """A body read, with where its array's elements end in its bytes and each element's hash."""

    raw: bytes
    head: dict[str, Any]  # the top-level keys before the array, in order
    elements: list[Any]
    ends: tuple[int, ...]  # offset just after each element
    hashes: tuple[int, ...]
    tail: dict[str, Any]  # the top-level keys after the array, in order
    close: int  # the offset of the array's `]`

    @property
    def after_array(self) -> memoryview:
        """Its bytes from the array's `]` to the end."""
        return memoryview(self.raw)[self.close :]


def located_body(raw: bytes, value: Any, key: str) -> LocatedBody | None:
    """`raw` (read as `value`) with the offsets of the elements of its array `key`, when they are
    all objects; None otherwise."""
    if type(value) is not dict:
        return None
    elements = value.get(key)
    if type(elements) is not list or not elements or any(type(e) is not dict for e in elements):
        return None
    opened = array_start(raw, key)
    if opened is None:
        return None
    spans = element_spans(raw, opened, elements)
    if spans is None:
        return None
    names = list(value)
    at = names.index(key)
    head = {name: value[name] for name in names[:at]}
    tail = {name: value[name] for name in names[at + 1 :]}
    ends, hashes, close = spans
    return LocatedBody(raw, head, elements, ends, hashes, tail, close)


def array_start(raw: bytes, key: str) -> int | None:
    """Where the array under the top-level `key` starts (just after its `[`), when the key is
    written plainly (no escapes); None otherwise."""
    token_of_key = b'"' + key.encode() + b'"'
    depth = 0
    for match in _KEY.finditer(raw):
        token = match.group()
        if token[0] == 0x22:
            if depth == 1 and token == token_of_key:
                colon = _COLON_BRACKET.match(raw, match.end())
                if colon is not None:
                    return colon.end()
            continue
        depth += 1 if token in (b"{", b"[") else -1
    return None


def shared_elements(raw: bytes, earlier: LocatedBody, beat: int = 0) -> int:
    """How many of `earlier`'s elements `raw` holds in the same bytes from its first byte on;
    0 when that is not more than `beat`. Bodies differ near their end (a turn replaced or
    added), so the search steps back from the last element, then halves. Each element's own
    bytes are compared before all that precede it: a body that shares an earlier one's opening
    but not element i (a sibling branch of a conversation) is told apart by element i alone,
    not by comparing the whole opening first; bytes found equal once are not compared again."""
    ends, old = earlier.ends, memoryview(earlier.raw)  # compared in place, never copied
    size, last = len(raw), len(ends) - 1
    equal = 0  # raw[:equal] is known to be earlier.raw[:equal]

    def same(i: int) -> bool:
        nonlocal equal
        end = ends[i]
        if end <= equal:
            return size > end
        start = max(ends[i - 1] if i else 0, equal)
        if size > end and raw.startswith(old[start:end], start) and raw.startswith(old[equal:start], equal):
            equal = end
            return True
        return False

    if beat > last or not same(beat):
        return 0
    high, step = last + 1, 1  # ends[beat] is shared, ends[high] (past the last: none) is not
    while high - step > beat and not same(high - step):
        high, step = high - step, step * 2
    low = max(beat, high - step)  # shared when the loop stopped on a match, else beat
    while high - low > 1:
        middle = (low + high) // 2
        if same(middle):
            low = middle
        else:
            high = middle
    return low + 1


def element_spans(raw: bytes, position: int, elements: list[Any]) -> Spans | None:
    """The end offsets and hashes of `elements`, the parsed values of the array elements written
    in `raw` from `position` (just after the `[`, or after an earlier element) to the array's `]`,
    and where that `]` is; None when they are not all objects. A client that writes JSON
    compactly (the SDKs, orjson, JSON.stringify) wrote each element as orjson writes it back:
    then the element's bytes are found by comparison (a complete JSON value ends where its text
    ends); otherwise by a scan of the brackets outside strings."""
    ends: list[int] = []
    hashes: list[int] = []
    try:
        for element in elements:
            separator = _SEPARATOR.match(raw, position)
            if separator is None:
                return _scanned(raw, position, elements)
            text = orjson.dumps(element)
            if not raw.startswith(text, separator.end()):
                return _scanned(raw, position, elements)
            position = separator.end() + len(text)
            ends.append(position)
            hashes.append(digest(text))
    except TypeError:  # an integer beyond 64 bits: orjson cannot write it
        return _scanned(raw, position, elements)
    closed = _CLOSE.match(raw, position)
    if closed is None:
        return None
    return tuple(ends), tuple(hashes), closed.end() - 1


def _scanned(raw: bytes, position: int, elements: list[Any]) -> Spans | None:
    """`element_spans` by a scan of the brackets outside strings, from `position` on."""
    spans: list[tuple[int, int]] = []
    depth, start, close = 0, position, None
    for match in _BRACKET.finditer(raw, position):
        bracket = raw[match.start(1)]
        if bracket == 0x7B or bracket == 0x5B:  # { [
            if depth == 0:
                if bracket == 0x5B:
                    return None
                start = match.start(1)
            depth += 1
            continue
        depth -= 1
        if depth == 0:
            spans.append((start, match.end(1)))
        elif depth < 0:
            close = match.start(1)
            break
    if len(spans) != len(elements) or close is None:  # a scalar element leaves no bracket
        return None
    return tuple(e for _, e in spans), tuple(digest(raw[s:e]) for s, e in spans), close
