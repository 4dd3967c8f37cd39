"""JSON in and out: orjson for speed, the standard library where orjson would change the data.

orjson turns integers beyond 64 bits into floats (losing digits) and rejects the
`NaN`/`Infinity` extensions some clients send; a request must never change, or fail, because of
how we parse it. After orjson, one walk over the values (not the bytes) looks for a float that
could have been such an integer; if there is one, the body is parsed again by the standard
library, which keeps every integer exact.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

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
