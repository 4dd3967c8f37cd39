"""JSON at the edge, refused when it is ambiguous: duplicate keys, deep nesting, lone surrogates.

A JSON object with a key twice is read differently by different parsers (first wins, last wins,
error). The proxy must count exactly what the upstream will read, so a body with a duplicate key
is refused with 400 naming the key, never counted one way and forwarded another.

orjson (fast) keeps the last duplicate silently, and the standard library's `object_pairs_hook`
(exact) costs three times a parse. So the exact check runs only when a byte-level count says a
duplicate is possible: `keys_written(raw)`, the number of `":` in the body less escaped ones, can
only exceed the same count over the parsed value re-serialised if some key was written twice (or
the body is spelled in a way the count does not model, which also takes the exact path). On a
1 MB chat body the count costs about a third of the parse.

Nesting deeper than `JsonLimits.max_depth` (default 64 containers: tool schemas rarely pass 20)
is refused before anything recurses over it; orjson, the standard library and the counting code
all have recursion limits of their own that a client must not reach. A string holding a lone
UTF-16 surrogate (`"\\ud800"`) is not Unicode, cannot be encoded to UTF-8 for the upstream or the
log, and is refused too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.codec import loads

DEFAULT_MAX_DEPTH = 64
_SPACE_BEFORE_COLON = re.compile(rb'"[ \t\r\n]+:')
# Escapes that would hide a quote, colon or backslash from the byte count: take the exact path.
_COUNT_HIDING_ESCAPE = re.compile(rb"\\u00(?:22|3[aA]|5[cC])")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class AmbiguousJson(ValueError):
    """Valid JSON the proxy will not guess about; `key` names the duplicated key, if that is why."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


@dataclass(frozen=True)
class JsonLimits:
    max_depth: int = DEFAULT_MAX_DEPTH

    def __post_init__(self) -> None:
        if not isinstance(self.max_depth, int) or isinstance(self.max_depth, bool) or not 2 <= self.max_depth <= 200:
            # orjson cannot write a value nested more than 254 deep: a trimmed body must still serialise.
            raise ValueError(f"max_json_depth must be a whole number from 2 to 200, not {self.max_depth!r}")


def loads_strict(raw: bytes, limits: JsonLimits = JsonLimits()) -> Any:
    """Parse `raw` as `proxy.codec.loads` does; ValueError when it is not JSON, AmbiguousJson when
    it nests too deeply, holds a lone surrogate or writes a key twice in one object."""
    value = loads(raw)
    depth = nesting_depth(value, limits.max_depth)
    if depth > limits.max_depth:
        raise AmbiguousJson(f"the JSON nests deeper than {limits.max_depth} levels")
    if _SURROGATE_ESCAPE.search(raw) and _holds_lone_surrogate(value):
        raise AmbiguousJson("the JSON holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape)")
    if _may_repeat_a_key(raw, value):
        _find_duplicate_key(raw)
    return value


def nesting_depth(value: Any, stop_past: int) -> int:
    """How many containers deep `value` goes, counting stops once past `stop_past`."""
    level, depth = [value], 0
    while level:
        containers = [x for x in level if type(x) is dict or type(x) is list]
        if not containers:
            break
        depth += 1
        if depth > stop_past:
            break
        level = [x for c in containers for x in (c.values() if type(c) is dict else c)]
    return depth


def keys_written(raw: bytes) -> int:
    """Upper bound on the keys written in `raw` (compact, unescaped spelling assumed): every key
    ends in `":`; an escaped quote inside a string (`\\":`) is no key."""
    return raw.count(b'":') - raw.count(b'\\":')


def _may_repeat_a_key(raw: bytes, value: Any) -> bool:
    if b'\\\\"' in raw or _SPACE_BEFORE_COLON.search(raw) or _COUNT_HIDING_ESCAPE.search(raw):
        return True  # spelled in a way `keys_written` does not model
    try:
        unique = orjson.dumps(value)
    except TypeError:  # an integer beyond 64 bits: count exactly
        return True
    return keys_written(raw) != keys_written(unique)


def _find_duplicate_key(raw: bytes) -> None:
    def refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for key, item in pairs:
            if key in obj:
                raise AmbiguousJson(f"the JSON has the key {key!r} twice in one object", key=key)
            obj[key] = item
        return obj

    json.loads(raw, object_pairs_hook=refuse_duplicates)


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
