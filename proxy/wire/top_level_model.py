"""A JSON body's top-level `model`, found without building the body's values.

A pass-through body (`/v1/embeddings`, ...) is routed by its `model`. Parsing the whole body for
it built every value with the GIL held: orjson on 3.9 MB of 80,000 small objects, in a thread,
held the event loop 59-127 ms. This reader walks the body's structure instead and builds nothing
but the one string it returns:

- the bytes are checked to be UTF-8 a slice at a time (as `json.loads` decodes them: lone
  surrogates pass, a UTF-8 byte order mark is skipped, UTF-16 and UTF-32 are re-encoded first);
- the text is walked container by container with a stack: in each, one regular expression eats
  a run of at most `_RUN` members whose values are scalars (strings, numbers, literals, `NaN`
  and `Infinity` as `json.loads` takes them) or, below the top level, containers of at most
  `_FLAT` scalars; a larger container's opening ends the run and is pushed. No one call into
  the regex engine holds the GIL long (one string is read in one call: 10-15 ms for 4 MB), and
  the GIL is given away after each 64 KiB, so that the event loop waiting for it takes it then;
- a top-level key `"model"` (also written with `\\u` escapes) is found by the runs read at the
  top level, in the same pass; the last one wins, as in orjson and `json.loads`, and its value is
  decoded by the same reader as the whole body was (`proxy.wire.codec.loads`) when it is a string.

A body of at most `PARSED_BYTES` is parsed whole all the same: orjson is faster than the walk
and holds the GIL under a millisecond for it.

The answer is the one `proxy.wire.codec.loads(raw).get("model")` gives (a string, else None, and
None for a body that is not JSON or not an object), containers up to orjson's 1,024 deep. One
case differs, on purpose: a body nested more than about 990 deep that only `json.loads` reads
(with `NaN` or a lone surrogate) was refused there by the interpreter's recursion limit, which
depends on the stack; it is read here.
"""

from __future__ import annotations

import codecs
import json
import re
import time

from proxy.wire.codec import loads

# Up to this size a body is parsed whole: orjson is 3-8 times faster than the walk below (2 KB of
# embeddings input: 3.7 us against 29) and holds the GIL under a millisecond for any body of it
# within density (64 KiB of `[0],`: 0.74 ms; 256 KiB: 4.1 ms).
PARSED_BYTES = 64 * 1024
MAX_DEPTH = 1024  # orjson's limit; json.loads stops sooner (its recursion limit)
_RUN = 1024  # members read by one regex call (each a scalar or a container of `_FLAT`)
# The walk gives the GIL away (`time.sleep(0)`) after each stretch of this many bytes: a thread
# waiting for it, the event loop's, takes it then rather than at the next switch interval (5 ms,
# waited again at each of its system calls). Four bodies of 3.9 MB walked in two threads held
# /livez 52-75 ms without it, 17-29 ms with it (without any walk: 4-25 ms).
_YIELD_BYTES = 64 * 1024

_WS = rb"[ \t\n\r]*+"
_STRING = rb'"(?:[^"\\\x00-\x1f]++|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*+"'
_SCALAR = _STRING + rb"|-?(?:0|[1-9][0-9]*+)(?:\.[0-9]++)?+(?:[eE][-+]?[0-9]++)?+|true|false|null|NaN|-?Infinity"
# Below the top level, a container of at most `_FLAT` scalars is read as a value of its parent's
# run (80,000 objects `{"a": "..."}` in an array: 80 regex calls, not 240,000).
_FLAT = 64


def _pattern(template: bytes, **parts: bytes | int) -> bytes:
    """`template` with `%(name)b` filled: whitespace, a string, a key and its colon (`member`),
    a scalar, and the `parts` given."""
    names = {b"ws": _WS, b"string": _STRING, b"scalar": _SCALAR, b"member": _STRING + _WS + rb":" + _WS}
    names.update({name.encode(): b"%d" % part if isinstance(part, int) else part for name, part in parts.items()})
    return template % names


_VALUE = _pattern(
    rb"%(scalar)b"
    rb"|\{%(ws)b(?:%(member)b(?:%(scalar)b)(?:%(ws)b,%(ws)b%(member)b(?:%(scalar)b)){0,%(more)b}+%(ws)b)?+\}"
    rb"|\[%(ws)b(?:(?:%(scalar)b)(?:%(ws)b,%(ws)b(?:%(scalar)b)){0,%(more)b}+%(ws)b)?+\]",
    more=_FLAT - 1,
)


def _runs(value: bytes) -> tuple[re.Pattern[bytes], ...]:
    """The four runs of a container's members whose values match `value`: after an object's `{`,
    after one of its values, after an array's `[`, after one of its values. Each ends at the next
    member's container value opening (`open`), at the container's close (`close`), or at neither
    (`more`) once it has read `_RUN` members; after `{` or `[` it reads one member at most."""
    patterns = (
        rb"%(ws)b(?:(?P<close>\})|%(member)b(?:(?:%(value)b)(?P<more>)|(?P<open>[{\[])))",
        rb"(?:%(ws)b,%(ws)b%(member)b(?:%(value)b)){0,%(run)b}+"
        rb"%(ws)b(?:(?P<close>\})|,%(ws)b%(member)b(?P<open>[{\[])|(?P<more>))",
        rb"%(ws)b(?:(?P<close>\])|(?:%(value)b)(?P<more>)|(?P<open>[{\[]))",
        rb"(?:%(ws)b,%(ws)b(?:%(value)b)){0,%(run)b}+%(ws)b(?:(?P<close>\])|,%(ws)b(?P<open>[{\[])|(?P<more>))",
    )
    return tuple(re.compile(_pattern(pattern, value=value, run=_RUN)) for pattern in patterns)


# At the top level only scalars are read within a run, so that a run there holds the top level's
# own keys and nothing nested; at the depth limit too.
_TOP_RUNS = _runs(_SCALAR)
_NESTED_RUNS = _runs(_VALUE)
_TOP = re.compile(_pattern(rb"%(ws)b(?:(?P<open>[{\[])|(?:%(scalar)b)%(ws)b\Z)"))
_END = re.compile(_WS + rb"\Z")
# A key that reads as `model`: each letter as itself or as a `\u` escape.
_MODEL = rb'"(?:m|\\u006[dD])(?:o|\\u006[fF])(?:d|\\u0064)(?:e|\\u0065)(?:l|\\u006[cC])"'
# The top-level object's runs, as `_runs(_SCALAR)`'s for an object, which also say where the value
# of the last key `model` among their members starts: `value` (a member read in the run) or `last`
# (the member whose container value ends the run, or the first member after `{`). A group in a
# repeat keeps its last match, so the run finds the key in the same pass: searching the run's
# bytes again for it had cost as much as reading them (21 ms over a 4 MB string).
_TOP_OBJECT = (
    re.compile(
        _pattern(
            rb"%(ws)b(?:(?P<close>\})|(?:%(model)b%(ws)b:%(ws)b(?P<last>)|%(member)b)"
            rb"(?:(?:%(scalar)b)(?P<more>)|(?P<open>[{\[])))",
            model=_MODEL,
        )
    ),
    re.compile(
        _pattern(
            rb"(?:%(ws)b,%(ws)b(?:%(model)b%(ws)b:%(ws)b(?P<value>)|%(member)b)(?:%(scalar)b)){0,%(run)b}+"
            rb"%(ws)b(?:(?P<close>\})|,%(ws)b(?:%(model)b%(ws)b:%(ws)b(?P<last>)|%(member)b)(?P<open>[{\[])|(?P<more>))",
            model=_MODEL,
            run=_RUN,
        )
    ),
)
_VALUE_STRING = re.compile(_STRING)


def top_level_model(raw: bytes) -> str | None:
    """The top-level `model` of the JSON object `raw` when it is a string; None when it is not a
    string or absent, when `raw` is not an object, and when it is not JSON: parsed whole up to
    `PARSED_BYTES`, read by `scanned_model` above."""
    if len(raw) > PARSED_BYTES:
        return scanned_model(raw)
    try:
        value = loads(raw)
    except ValueError:
        return None
    model = value.get("model") if isinstance(value, dict) else None
    return model if isinstance(model, str) else None


def scanned_model(raw: bytes) -> str | None:
    """`top_level_model(raw)`, found without building `raw`'s values."""
    text = _utf8(raw)
    value_at = None if text is None else _last_model_value(text)
    if text is None or value_at is None:
        return None
    string = _VALUE_STRING.match(text, value_at)
    if string is None:
        return None  # a number, a literal or a container
    model = loads(string.group())
    return model if isinstance(model, str) else None


def _utf8(raw: bytes) -> bytes | None:
    """`raw` as UTF-8 text `json.loads` would read (its encoding as `json.detect_encoding` finds
    it), or None when it does not decode."""
    encoding = json.detect_encoding(raw)
    try:
        if encoding == "utf-8-sig":
            raw = raw[3:]
        elif encoding != "utf-8":
            return raw.decode(encoding, "surrogatepass").encode("utf-8", "surrogatepass")
        decoder = codecs.getincrementaldecoder("utf-8")("surrogatepass")
        for start in range(0, len(raw), _YIELD_BYTES):
            decoder.decode(raw[start : start + _YIELD_BYTES])
            time.sleep(0)
        decoder.decode(b"", final=True)
    except UnicodeError:
        return None
    return raw


def _last_model_value(text: bytes) -> int | None:
    """Where the value of the last top-level key `model` of `text` starts; None when `text` is not
    JSON, not an object, or has no such key."""
    first = _TOP.match(text)
    if first is None:
        return None
    if first.group("open") is None:
        return None  # a lone scalar
    stack = [first.group("open")]
    pos, fresh, value_at, yielded_at = first.end(), True, None, 0
    while stack:
        if pos - yielded_at >= _YIELD_BYTES:
            time.sleep(0)
            yielded_at = pos
        is_object = stack[-1] == b"{"
        if is_object and len(stack) == 1:
            run = _TOP_OBJECT[not fresh].match(text, pos)
        else:
            runs = _NESTED_RUNS if 1 < len(stack) < MAX_DEPTH else _TOP_RUNS  # an inlined container is one deeper
            run = runs[(0 if is_object else 2) + (not fresh)].match(text, pos)
        if run is None:
            return None
        opened, closed = run.group("open"), run.group("close")
        if opened is None and closed is None and run.end() == pos:
            return None  # neither a member, a close nor an open: not JSON
        if is_object and len(stack) == 1:  # the top level's own keys
            at = run.start("last")  # after every `value` of its run
            if at < 0 and not fresh:
                at = run.start("value")
            if at >= 0:
                value_at = at
        pos = run.end()
        if closed is not None:
            stack.pop()
            fresh = False
        elif opened is not None:
            if len(stack) == MAX_DEPTH:
                return None
            stack.append(opened)
            fresh = True
        else:
            fresh = False
    return value_at if _END.match(text, pos) else None


_NAMED_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]{1,256})"')
_MODEL_PEEK_BYTES = 4096


def named_model(raw: bytes) -> str | None:
    """The model a body that could not be parsed names near its start, for its log line and row
    (bounded: the first 4 KiB only, never a second parse of a refused body)."""
    found = _NAMED_MODEL.search(raw[:_MODEL_PEEK_BYTES])
    return found.group(1).decode("utf-8", "replace") if found else None
