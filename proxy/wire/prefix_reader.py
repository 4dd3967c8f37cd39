"""Reading a body that re-sends an earlier body's array: only the new bytes are parsed.

A chat client sends the whole conversation with every request: the next body is the last one
with a turn or two appended. Its bytes up to the end of the last message they share are the
same bytes, so they parse to the same values, pass the same checks and count the same. This
reader keeps recent bodies it was told an adapter accepted (`keep`), and reads a new body that
starts with one of them by parsing strictly only what follows the shared messages.

Why it gives exactly what `read_json` gives:
- A JSON parser's state after a run of bytes depends only on those bytes. When a new body's
  bytes equal an earlier body's up to the end of its array element k (an offset recorded when
  that body was read), the new body holds the same top-level keys before the array and the
  same elements 0..k, already read strictly (no key twice, depth, surrogates, UTF-8).
- The rest of the body (`,{...}, ...], "tools": [...], ...}`) is read by the same strict
  reader, wrapped as `{"<marker>":[0` + rest so that it is one JSON object whose new elements
  sit at their real depth and whose remaining top-level keys are checked for duplicates among
  themselves; keys that repeat one before the array (or the array's own key) are refused here
  and left to the full reader, which gives every error and its words.
- When the new body also ends with the earlier body's bytes from its array's `]` on (the same
  tools, the same options: the usual re-send), only the new elements are read (wrapped as
  `{"<marker>":[0` + new elements + `]}`, which must read as that one key) and the keys after
  the array are the earlier body's values: the same bytes in the same place of an object
  after its array, so the same values, already checked.
- A body sent again as it was (a retry, a regenerated answer) is found by comparing its bytes
  with those of the earlier bodies it may extend (1 us for 88 KB), before any element is
  matched, and with the most recent body of its family before any other is looked for: the body
  kept before is reused whole (its value in a new top-level object, every element and key
  known), and nothing of it is parsed, matched or kept again.
- A body that shares all but its last few KiB with the most recent body of its family (the next
  turn of that conversation, or another client's turn after the same messages) is read from it
  without looking for a better one: the most another could save is those few KiB.
- Anything unexpected (no earlier body, a different array, a rest that does not read, elements
  that are not objects) takes the full reader: this path only ever saves work.

The values of the shared elements are the very objects read before, so code after this must
not change a parsed body in place (the core builds new bodies; a test holds it to that). Each
element also gets a hash of its own bytes, which the count cache uses as the message's key
(equal bytes read to equal messages), so a re-sent message is neither re-serialised nor hashed.

Memory: the bodies kept are bounded in number and in bytes (their parsed values are about
three times their size); the least recently used goes first.

This module reads, reuses and keeps bodies; locating a body's elements in its bytes and comparing
a new body's bytes with a kept one's is `proxy.wire.array_bytes`'s.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from proxy.apis.fields import NOTHING_KNOWN, KnownPrefix
from proxy.wire.array_bytes import LocatedBody, element_spans, located_body, shared_elements
from proxy.wire.codec import DEFAULT_LIMITS, JsonLimits, read_json

_HEAD = 128  # bytes of a body that name its family of earlier bodies
_MARKER = "\x00earlier"
_WRAP = b'{"\\u0000earlier":[0'
_CLOSE_ENOUGH = 4096  # new bytes left to read past a candidate that end the search for a better one
_CANDIDATES = 4  # earlier bodies compared in full, of each kind below
_FAMILY_SCAN = 32  # the most recent bodies of a family looked at: the conversations being had
_JSON_SPACE = b" \t\r\n"  # JSON's whitespace: not bytes.strip()'s, which takes \v and \f too


@dataclass(frozen=True)
class Match:
    """What a body shares with the earlier bodies kept: `shared` elements of `earlier`, and the
    bytes after them that are left to read (`new_bytes`: the whole body when none is shared).
    `kept` is False for a body this reader neither reuses nor keeps (too small or too large)."""

    new_bytes: int
    earlier: LocatedBody | None = None
    shared: int = 0
    kept: bool = True
    same: bool = False  # `raw` is `earlier.raw`, byte for byte: nothing of it is read again


@dataclass(frozen=True)
class Reading:
    """A body read: its value (equal to `read_json`'s), what was known of its array, and what
    `PrefixReader.keep` needs to let a later body build on it."""

    value: Any
    known: KnownPrefix = NOTHING_KNOWN
    body: LocatedBody | None = None
    extends: LocatedBody | None = None


class PrefixReader:
    """Strict reads of bodies holding the array `key`, reusing the earlier bodies they extend."""

    def __init__(
        self,
        key: str,
        limits: JsonLimits = DEFAULT_LIMITS,
        *,
        max_bytes: int = 8 * 1024 * 1024,
        max_bodies: int = 256,
        min_body: int = 4096,
    ) -> None:
        self.key = key
        self.limits = limits
        self.max_bytes, self.max_bodies, self.min_body = max_bytes, max_bodies, min_body
        self._bodies: OrderedDict[int, LocatedBody] = OrderedDict()  # by id, least recently used first
        self._by_head: dict[bytes, _Family] = {}
        self._bytes = 0
        self._seen_whole: set[int] = set()  # ids of the bodies kept whose views had every part seen
        self._lock = threading.Lock()  # large bodies are read on worker threads

    def match(self, raw: bytes) -> Match:
        """The earlier body `raw` shares the most elements with, and how many: a comparison of
        bytes, cheap whatever the body's size (the parse is `read`'s)."""
        if len(raw) < self.min_body or self.max_bytes <= 0 or len(raw) > self.max_bytes // 4:
            return Match(len(raw), None, 0, kept=False)
        recent = self._most_recent(raw)
        best, most = None, 0
        if recent is not None:
            if _same_bytes(raw, recent):  # sent again at once: a retry, a regenerated answer
                return Match(0, recent, len(recent.ends), same=True)
            # The conversation's last body, or a sibling of it (another client's turn after the
            # same messages): when what is left to read is small, no other body is looked for
            # but the few kept just before it, which this body may be sent again.
            most = shared_elements(raw, recent)
            if most:
                best = recent
                if most == len(recent.ends) or len(raw) - recent.ends[most - 1] <= _CLOSE_ENOUGH:
                    again = self._kept_just_before(raw)
                    if again is not None:
                        return Match(0, again, len(again.ends), same=True)
                    self._used(recent)
                    return Match(len(raw) - recent.ends[most - 1], recent, most)
        for earlier in self._candidates(raw):
            if earlier is recent:
                continue
            if _same_bytes(raw, earlier):
                return Match(0, earlier, len(earlier.ends), same=True)
            shared = shared_elements(raw, earlier, most)
            if shared > most:
                best, most = earlier, shared
                # It extends this body whole, or what is left to read is small: no other body
                # could save more than that.
                if shared == len(earlier.ends) or len(raw) - earlier.ends[shared - 1] <= _CLOSE_ENOUGH:
                    break
        return Match(len(raw) - best.ends[most - 1] if best is not None else len(raw), best, most)

    def read(self, raw: bytes, match: Match | None = None) -> Reading:
        """`read_json(raw, limits)`, raising its `UnreadableJson`, with the shared prefix reused
        (`match`: this body's, when the caller has it already)."""
        match = match if match is not None else self.match(raw)
        if not match.kept:
            return Reading(read_json(raw, self.limits))
        if match.same and match.earlier is not None:
            return _again(match.earlier, self.key, id(match.earlier) in self._seen_whole)
        if match.earlier is not None:
            reading = self._extend(raw, match.earlier, match.shared)
            if reading is not None:
                return reading
        value = read_json(raw, self.limits)
        body = located_body(raw, value, self.key)
        return Reading(value, KnownPrefix(0, body.hashes) if body is not None else NOTHING_KNOWN, body)

    def keep(self, reading: Reading, seen_whole: bool = False) -> None:
        """The body was accepted: later bodies may extend it (it supersedes the one it extended
        whole). With `seen_whole`, its view had no part the guard cannot see: a later body's
        `KnownPrefix.seen_whole` says so of the elements it shares."""
        body = reading.body
        if body is None:
            return
        with self._lock:
            if seen_whole:
                self._seen_whole.add(id(body))
            if id(body) in self._bodies:  # a body sent again: kept already, now the most recent
                self._bodies.move_to_end(id(body))
                family = self._by_head.get(body.raw[:_HEAD])
                if family is not None:
                    family.add(body)
                return
            earlier = reading.extends
            if earlier is not None and reading.known.checked == len(earlier.ends) and id(earlier) in self._bodies:
                self._drop(earlier)
            self._bodies[id(body)] = body
            family = self._by_head.get(body.raw[:_HEAD])
            if family is None:
                family = self._by_head[body.raw[:_HEAD]] = _Family()
            family.add(body)
            self._bytes += len(body.raw)
            while self._bodies and (self._bytes > self.max_bytes or len(self._bodies) > self.max_bodies):
                self._drop(next(iter(self._bodies.values())))

    # -- reading a body that extends an earlier one ------------------------------------------

    def _used(self, body: LocatedBody) -> None:
        """`body` is the one a body read now builds on: the last to be let go."""
        with self._lock:
            if id(body) in self._bodies:
                self._bodies.move_to_end(id(body))

    def _kept_just_before(self, raw: bytes) -> LocatedBody | None:
        """The body of `raw`'s family kept or used just before the most recent that is `raw`'s
        very bytes (told apart by length and last element first: about a microsecond each)."""
        with self._lock:
            family = self._by_head.get(raw[:_HEAD])
            before = family.newest(_CANDIDATES)[1:] if family is not None else ()
            return next((body for body in before if _same_bytes(raw, body)), None)

    def _most_recent(self, raw: bytes) -> LocatedBody | None:
        """The body of `raw`'s family kept or used last."""
        with self._lock:
            family = self._by_head.get(raw[:_HEAD])
            return family.newest_one() if family is not None else None

    def _candidates(self, raw: bytes) -> list[LocatedBody]:
        """The earlier bodies `raw` may extend, likeliest first. Of those that start with the same
        bytes (the same system prompt, say) and hold the same second element (a conversation's
        first question tells it apart), those whose last element closes where `raw` has the same
        bytes; then the others of those; then the most recent few, for a partial reuse. Only
        the most recent bodies of a family are looked at: an older conversation picked up again
        is read in full once, and kept again."""
        with self._lock:
            family = self._by_head.get(raw[:_HEAD])
            if family is None:
                return []
            recent = family.newest(_FAMILY_SCAN)
            size, whole, started = len(raw), [], []
            for body in recent:
                first, second, last = body.ends[0], body.ends[min(1, len(body.ends) - 1)], body.ends[-1]
                old = memoryview(body.raw)  # compared in place, never copied
                if size <= second or not raw.startswith(old[first:second], first):
                    continue
                # Its whole last element in the same bytes: a sibling (a turn of the same size
                # answered differently) may end as this one does.
                if size > last and _same_last(raw, body):
                    whole.append(body)
                    break  # the likeliest of all: the most recent body this one extends whole
                started.append(body)
                if len(started) == _CANDIDATES:
                    break
            chosen = list({id(b): b for b in (*whole, *started, *recent[:_CANDIDATES])}.values())
            self._bodies.move_to_end(id(chosen[0]))
            return chosen

    def _extend(self, raw: bytes, earlier: LocatedBody, shared: int) -> Reading | None:
        """`raw` read as `earlier`'s first `shared` elements and the rest parsed; None when the
        rest does not read (the full reader says why)."""
        start = earlier.ends[shared - 1]
        reused = self._new_elements(raw, earlier, start)
        if reused is not None:
            added, tail = reused
        else:
            try:
                rest = read_json(_WRAP + raw[start:], self.limits)
            except ValueError:
                return None  # the full reader says what is wrong
            if type(rest) is not dict:
                return None
            added = rest.pop(_MARKER, None)
            if type(added) is not list or not added or added[0] != 0:
                return None
            # A key twice: the full reader refuses it.
            if self.key in rest or any(name in rest for name in earlier.head):
                return None
            added, tail = added[1:], rest
        if any(type(e) is not dict for e in added):
            return None
        spans = element_spans(raw, start, added)
        if spans is None:
            return None
        elements = [*earlier.elements[:shared], *added]
        value = {**earlier.head, self.key: elements, **tail}
        ends, hashes = earlier.ends[:shared] + spans[0], earlier.hashes[:shared] + spans[1]
        body = LocatedBody(raw, earlier.head, elements, ends, hashes, tail, spans[2])
        seen = shared if id(earlier) in self._seen_whole else 0
        return Reading(value, KnownPrefix(shared, hashes, reused is not None, seen_whole=seen), body, earlier)

    def _new_elements(self, raw: bytes, earlier: LocatedBody, start: int) -> tuple[list[Any], dict[str, Any]] | None:
        """When `raw` ends as `earlier` does from its array's `]` on: the elements between the
        shared ones and that `]` (read strictly, at their real depth), and `earlier`'s keys
        after the array; None otherwise (the whole rest is then read)."""
        after = earlier.after_array
        close = len(raw) - len(after)
        if close < start or not raw.endswith(after):
            return None
        if not raw[start:close].strip(_JSON_SPACE):  # no element after the shared ones: a body sent again
            return [], earlier.tail
        try:
            rest = read_json(_WRAP + raw[start:close] + b"]}", self.limits)
        except ValueError:
            return None
        added = rest.get(_MARKER) if type(rest) is dict and len(rest) == 1 else None
        if type(added) is not list or len(added) < 2 or added[0] != 0:
            return None  # not elements alone: the `]` met was not the array's
        return added[1:], earlier.tail

    # -- the bodies kept ----------------------------------------------------------------------

    def _drop(self, body: LocatedBody) -> None:
        del self._bodies[id(body)]
        self._seen_whole.discard(id(body))
        self._bytes -= len(body.raw)
        head = body.raw[:_HEAD]
        family = self._by_head.get(head)
        if family is not None and family.remove(body):
            del self._by_head[head]


class _Family:
    """The bodies kept that start with the same `_HEAD` bytes, in the order they were kept or
    used, by identity: adding, moving and removing one costs the same however many there are (a
    list searched for it cost 20 us a body let go with 256 kept, for the comparisons alone)."""

    __slots__ = ("_bodies",)

    def __init__(self) -> None:
        self._bodies: OrderedDict[int, LocatedBody] = OrderedDict()  # most recent last

    def add(self, body: LocatedBody) -> None:
        """`body` kept or used now: the most recent."""
        self._bodies[id(body)] = body
        self._bodies.move_to_end(id(body))

    def remove(self, body: LocatedBody) -> bool:
        """`body` let go; whether the family is empty now."""
        self._bodies.pop(id(body), None)
        return not self._bodies

    def newest_one(self) -> LocatedBody | None:
        return next(reversed(self._bodies.values()), None)

    def newest(self, count: int) -> list[LocatedBody]:
        """The `count` most recent, most recent first."""
        return list(itertools.islice(reversed(self._bodies.values()), count))


def _same_bytes(raw: bytes, earlier: LocatedBody) -> bool:
    """Whether `raw` is `earlier`'s bytes. Unequal lengths are told apart at once, and bodies of one
    length differ in their last element (a new turn of the same size): compared first."""
    return len(earlier.raw) == len(raw) and _same_last(raw, earlier) and earlier.raw == raw


def _same_last(raw: bytes, earlier: LocatedBody) -> bool:
    """Whether `raw` holds `earlier`'s last element in the same bytes (compared in place)."""
    ends = earlier.ends
    if not ends:
        return True
    start = ends[-2] if len(ends) > 1 else 0
    return raw.startswith(memoryview(earlier.raw)[start : ends[-1]], start)


def _again(body: LocatedBody, key: str, seen_whole: bool) -> Reading:
    """A body sent again as it was: the value read before, in a new top-level object and array
    (the elements are the very ones read before, not to be changed in place, as for any shared
    element); every element and every other key known, nothing new to keep."""
    value = {**body.head, key: list(body.elements), **body.tail}
    known = KnownPrefix(len(body.ends), body.hashes, True, body, len(body.ends) if seen_whole else 0)
    return Reading(value, known, body)
