"""JSON in and out at the edge: orjson for speed, the standard library where orjson would change
the data, and a client's JSON refused when it is ambiguous.

orjson turns integers beyond 64 bits into floats (losing digits) and rejects the
`NaN`/`Infinity` extensions some clients send; a request must never change, or fail, because of
how we parse it. After orjson, one walk over the values (not the bytes) looks for a float that
could have been such an integer; if there is one, the body is parsed again by the standard
library, which keeps every integer exact (`loads`, `dumps`).

**Strict reading** (`read_json`, `loads_strict`) refuses what is ambiguous: duplicate keys, deep
nesting, lone surrogates.

A JSON object with a key twice is read differently by different parsers (first wins, last wins,
error). The proxy must count exactly what the upstream will read, so a body with a duplicate key
is refused with 400 naming the key, never counted one way and forwarded another.

Two passes give the same answer, the first at C speed on every ordinary body:

- **fast**: orjson parses, and the checks are counts, not walks over text in Python. orjson keeps
  the last of two equal keys, so the colons are counted: in the body, one per key plus those
  inside strings; in orjson's re-serialisation of what it parsed, one per key it kept plus the
  same colons inside strings (orjson never escapes a colon). Equal counts mean no key was dropped,
  unless a string wrote a colon as `\u003a` (then the exact pass decides). orjson refuses lone
  surrogates, `NaN`/`Infinity` and bad UTF-8 itself; one walk over the parsed values measures
  the nesting and finds an integer beyond 64 bits (which orjson turns into a float), unless the
  bytes alone rule both out (no more brackets than the depth bound, no run of 19 digits).
- **exact**: the standard library's C scanner with an `object_pairs_hook` that refuses a repeated
  key by name, integers of any size exact, `NaN`/`Infinity` accepted, as `loads` does. It
  runs when the fast pass refuses or doubts a body, so every error (and its text) comes from here.

Measured on a warm 88 KB conversation (min of 15 x 50 parses on two shared cores): the exact pass
alone 1.14 ms, the fast pass 0.45-0.6 ms (orjson 0.15, its re-serialisation 0.07, two colon
counts, the walk 0.09); on 1 MB, 14 ms against 7.

Nesting deeper than `JsonLimits.max_depth` (default 64 containers: tool schemas rarely pass 20)
is refused; orjson, the standard library and the counting code all have recursion limits of their
own that a client must not reach. The body must be UTF-8, and a string holding a lone UTF-16
surrogate (`"\\ud800"`) is not Unicode (it cannot be encoded for the upstream or the log), so both
are refused too.

**Dense JSON.** A parsed value costs far more memory than its text: 72 bytes for each `[]`, 192
for each `{"a":0}`, about 60 for each short string or number after a comma. 30 MiB of `[],` in a
field the guard never reads made 917 MB of objects. Before parsing, the body's values are
weighed (`dense_units`: three units an object, one an array, one a comma, each unit standing for
at most 64 bytes of objects) and a body over `MAX_UNITS_FLOOR` units plus one per
`BYTES_PER_UNIT` bytes is refused: the objects then stay under about 2.7 times the body beyond a
fixed 16 MB. The first weighing counts brackets and commas anywhere (a C count); only a body it
puts over the bound is weighed again with its strings taken out, so prose and code in strings,
however full of brackets, never count.

`read_json(raw)` is the one reader the server and the CLI share: its `UnreadableJson` carries the
client-facing message ("the request body is ambiguous: ..." or "... is not valid JSON: ...") and
the duplicated key, if that is why.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.core import slices
from proxy.core.plan import BodyError
from proxy.wire.long_strings import sliced_loads

_INT64_LIMIT = 2.0**63


def loads(raw: bytes) -> Any:
    """Parse JSON; raises ValueError with the reason when it is not JSON."""
    try:
        return _loads(raw)
    except RecursionError:  # nested past the interpreter's own limit (orjson stops at 1024)
        raise ValueError("the JSON nests too deeply to parse") from None


def _loads(raw: bytes) -> Any:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as fast_error:
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            raise ValueError(str(fast_error)) from None
    return json.loads(raw) if _may_hold_a_big_integer(value) else value


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:  # integers beyond 64 bits
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "surrogatepass")


def _may_hold_a_big_integer(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            stack.extend(item.values())
        elif kind is list:
            stack.extend(item)
        elif kind is float and abs(item) >= _INT64_LIMIT and item.is_integer():
            return True
    return False


DEFAULT_MAX_DEPTH = 64
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# An integer orjson turns into a float has at least 19 digits (2**63 has 19): a body with no run of
# 19 digits anywhere holds none, and one with no more brackets than the depth bound cannot nest
# past it, so the walk over its values is skipped (most of the cost of reading a short text such
# as the new turn of a re-sent conversation: 7 of 12 us). The run is looked for with the bytes
# mapped to "0" (a digit) and " " (anything else) and one search for nineteen "0"s, in slices of
# `_DIGIT_SLICE` bytes that overlap by 18: a regular expression for it tried a match at every byte,
# 1.18 ms on 52 KB of prose (the whole read of a two-message chat body holding it: 1.36 ms -> 0.22)
# and 4.3 us on the 186 bytes of a new turn (the mapping: 61 us and 2.4 us). UTF-8 writes no ASCII
# digit inside another character.
_DIGITS = bytes(0x30 if 0x30 <= byte <= 0x39 else 0x20 for byte in range(256))
_LONG_RUN = b"0" * 19
_DIGIT_SLICE = 64 * 1024


class AmbiguousJson(BodyError):
    """Valid JSON the proxy will not guess about; `param` names the duplicated key, if that is why."""


@dataclass(frozen=True)
class JsonLimits:
    max_depth: int = DEFAULT_MAX_DEPTH

    def __post_init__(self) -> None:
        if not isinstance(self.max_depth, int) or isinstance(self.max_depth, bool) or not 2 <= self.max_depth <= 200:
            # orjson cannot write a value nested more than 254 deep: a trimmed body must still serialise.
            raise ValueError(f"max_json_depth must be a whole number from 2 to 200, not {self.max_depth!r}")


DEFAULT_LIMITS = JsonLimits()


class DenseJson(BodyError):
    """A body whose values would take too much memory for its size once parsed (see above)."""


# A body may hold this many units of values whatever its size (a 6 MB body of tool schemas fits),
# and one more per `BYTES_PER_UNIT` bytes of it.
MAX_UNITS_FLOOR = 256 * 1024
BYTES_PER_UNIT = 24
# A JSON string, escapes included (unrolled: no backtracking); taken out before the exact weighing.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
# A stretch of at most 64 Ki bytes outside strings and whole strings, ending outside any: the exact
# weighing goes a stretch at a time, so that no one call into the regex engine (which holds the GIL,
# and with it the event loop) runs long.
_STRETCH = re.compile(rb'(?:[^"]|"[^"\\]*(?:\\.[^"\\]*)*"){1,65536}+')


def dense_units(raw: bytes, strings_out: bool = False, stop_past: int | None = None) -> int:
    """The weight of `raw`'s values: 3 an object, 1 an array, 1 a comma; with `strings_out`,
    only those outside strings (exact, weighing stops once past `stop_past`), else every
    bracket and comma (an upper bound)."""
    if not strings_out:
        return 3 * slices.count(raw, b"{") + slices.count(raw, b"[") + slices.count(raw, b",")
    units, pos = 0, 0
    while (stretch := _STRETCH.match(raw, pos)) is not None:  # None at an unterminated string: the rest is in it
        units += dense_units(_STRING.sub(b"", stretch.group()))
        if stop_past is not None and units > stop_past:
            break
        pos = stretch.end()
    return units


def check_density(raw: bytes) -> None:
    """Raise `DenseJson` when `raw`'s values weigh more than its size allows."""
    allowed = MAX_UNITS_FLOOR + len(raw) // BYTES_PER_UNIT
    if dense_units(raw) > allowed and dense_units(raw, strings_out=True, stop_past=allowed) > allowed:
        raise DenseJson(
            f"its {len(raw):,} bytes hold more JSON objects, arrays and values than the {allowed:,} units a "
            f"body of its size may (an object 3, an array or a value 1; one per {BYTES_PER_UNIT} bytes beyond "
            f"{MAX_UNITS_FLOOR:,})"
        )


class UnreadableJson(BodyError):
    """A body that is not JSON, or that the proxy will not guess about; the message is the
    client's, `param` names the duplicated key when that is why."""


def read_json(raw: bytes, limits: JsonLimits = DEFAULT_LIMITS) -> Any:
    """`loads_strict(raw)`, its errors worded for the client (the server's 400, the CLI's message)."""
    try:
        return loads_strict(raw, limits)
    except AmbiguousJson as exc:
        raise UnreadableJson(f"the request body is ambiguous: {exc}", param=exc.param) from None
    except DenseJson as exc:
        raise UnreadableJson(f"the request body is too dense: {exc}") from None
    except ValueError as exc:
        raise UnreadableJson(f"the request body is not valid JSON: {exc}") from None


def loads_strict(raw: bytes, limits: JsonLimits = DEFAULT_LIMITS) -> Any:
    """Parse `raw`; ValueError when it is not UTF-8 JSON, AmbiguousJson when it writes a key twice
    in one object, nests too deeply or holds a lone surrogate; DenseJson when its values would
    take too much memory for its size."""
    if 3 * len(raw) > MAX_UNITS_FLOOR:  # three units a byte at most: a smaller body is under the floor
        check_density(raw)
    # A large body is read with no whole-body call that holds the GIL long: its long strings
    # decoded a piece at a time (`proxy.wire.long_strings`), its bytes counted and searched a slice
    # at a time (`proxy.core.slices`). A smaller one with the bytes' own calls, as fast as they go.
    sliced = len(raw) > SLICED_BODY_BYTES
    count, contains = (slices.count, slices.contains) if sliced else (bytes.count, bytes.__contains__)
    try:
        value, keys_kept = sliced_loads(raw) if sliced else (orjson.loads(raw), None)
    except orjson.JSONDecodeError:  # not JSON to orjson: the exact pass says why, or accepts NaN
        return _loads_exact(raw, limits)
    if count(raw, b"{") + count(raw, b"[") > limits.max_depth or has_long_number(raw):
        depth, big_integer = _shape(value, limits.max_depth)
        if depth > limits.max_depth or big_integer:
            return _loads_exact(raw, limits)  # refused there by the same words, or read exactly
    if keys_kept is None:  # within the depth bound orjson can write it back (its own bound is 254)
        keys_kept = raw.count(b":") == orjson.dumps(value).count(b":")
    if not keys_kept or contains(raw, b"\\u003"):
        return _loads_exact(raw, limits)  # a key may have been dropped (or a colon escaped)
    return value


SLICED_BODY_BYTES = 4 * 1024 * 1024


def has_long_number(raw: bytes) -> bool:
    """Whether `raw` holds a run of at least 19 ASCII digits."""
    run = len(_LONG_RUN)
    for start in range(0, max(len(raw) - run + 1, 1), _DIGIT_SLICE):
        if _LONG_RUN in raw[start : start + _DIGIT_SLICE + run - 1].translate(_DIGITS):
            return True
    return False


def _loads_exact(raw: bytes, limits: JsonLimits) -> Any:
    try:
        text = raw.decode("utf-8")
        value = json.loads(text, object_pairs_hook=_refuse_duplicates)
    except UnicodeDecodeError as exc:
        raise ValueError(f"the body is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    except RecursionError:  # nested past the interpreter's own limit
        raise AmbiguousJson(f"the JSON nests deeper than {limits.max_depth} levels") from None
    if nesting_depth(value, limits.max_depth) > limits.max_depth:
        raise AmbiguousJson(f"the JSON nests deeper than {limits.max_depth} levels")
    if _SURROGATE_ESCAPE.search(text) and _holds_lone_surrogate(value):
        raise AmbiguousJson("the JSON holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape)")
    return value


def nesting_depth(value: Any, stop_past: int) -> int:
    """How many containers deep `value` goes, counting stops once past `stop_past`."""
    return _shape(value, stop_past, big_integers=False)[0]


def _shape(value: Any, stop_past: int, big_integers: bool = True) -> tuple[int, bool]:
    """How many containers deep `value` goes (counting stops once past `stop_past`), and (with
    `big_integers`) whether it holds a float that may have been an integer beyond 64 bits, which
    ends the walk; one walk, a level at a time."""
    level, depth = [value], 0
    while level:
        if big_integers:
            floats = [x for x in level if type(x) is float]
            if floats and any(abs(x) >= _INT64_LIMIT and x.is_integer() for x in floats):
                return depth, True
        containers = [x for x in level if type(x) is dict or type(x) is list]
        if not containers:
            break
        depth += 1
        if depth > stop_past:
            break
        level = [x for c in containers for x in (c.values() if type(c) is dict else c)]
    return depth, False


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # the common case, no duplicate, costs one comparison
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise AmbiguousJson(f"the JSON has the key {key!r} twice in one object", param=key)
            seen.add(key)
    return obj


def _holds_lone_surrogate(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is dict:
            stack.extend(item.keys())
            stack.extend(item.values())
        elif type(item) is list:
            stack.extend(item)
        elif type(item) is str:
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return True
    return False
