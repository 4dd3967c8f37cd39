"""JSON at the edge, refused when it is ambiguous: duplicate keys, deep nesting, lone surrogates.

A JSON object with a key twice is read differently by different parsers (first wins, last wins,
error). The proxy must count exactly what the upstream will read, so a body with a duplicate key
is refused with 400 naming the key, never counted one way and forwarded another.

orjson keeps the last duplicate silently, so the edge parses with the standard library's C
scanner and an `object_pairs_hook` that refuses a repeated key: one exact pass, which also keeps
integers beyond 64 bits exact and accepts the `NaN`/`Infinity` extensions, as `proxy.codec`
does. A cheaper-looking alternative was measured and dropped: orjson plus a byte-level count of
`":` (to run the exact check only when a duplicate is possible) cost *more* on 1 MB bodies
(about 25 ms against 13 ms on a plain body, 95 against 70 with many tool calls, on two shared
cores), since it still needs orjson, a walk over every value for big integers, and several scans.

Nesting deeper than `JsonLimits.max_depth` (default 64 containers: tool schemas rarely pass 20)
is refused; orjson, the standard library and the counting code all have recursion limits of their
own that a client must not reach. The body must be UTF-8, and a string holding a lone UTF-16
surrogate (`"\\ud800"`) is not Unicode (it cannot be encoded for the upstream or the log), so both
are refused too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_DEPTH = 64
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


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


DEFAULT_LIMITS = JsonLimits()


def loads_strict(raw: bytes, limits: JsonLimits = DEFAULT_LIMITS) -> Any:
    """Parse `raw`; ValueError when it is not UTF-8 JSON, AmbiguousJson when it writes a key twice
    in one object, nests too deeply or holds a lone surrogate."""
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


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # the common case, no duplicate, costs one comparison
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise AmbiguousJson(f"the JSON has the key {key!r} twice in one object", key=key)
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
