"""The fast reader (orjson and counts) answers exactly as a reader that checks every pair would:
the same value, or the same refusal naming the same key, on JSON written with duplicate keys,
colons inside strings and keys, escapes, whitespace, big integers and deep nesting."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.wire.codec import AmbiguousJson, JsonLimits, UnreadableJson, loads_strict, read_json

LIMITS = JsonLimits(max_depth=6)


def reference(raw: bytes, max_depth: int) -> tuple[str, Any]:
    """("value", v), ("duplicate", key), ("deep", None) or ("invalid", None), from first principles."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: set[str] = set()
        for key, _ in items:
            if key in seen:
                raise KeyError(key)
            seen.add(key)
        return dict(items)

    def depth(value: Any) -> int:
        if isinstance(value, dict):
            return 1 + max(map(depth, value.values()), default=0)
        if isinstance(value, list):
            return 1 + max(map(depth, value), default=0)
        return 0

    try:
        value = json.loads(raw.decode("utf-8"), object_pairs_hook=pairs)
    except KeyError as exc:
        return "duplicate", exc.args[0]
    except ValueError:
        return "invalid", None
    return ("deep", None) if depth(value) > max_depth else ("value", value)


def outcome(raw: bytes) -> tuple[str, Any]:
    try:
        return "value", loads_strict(raw, LIMITS)
    except AmbiguousJson as exc:
        return ("duplicate", exc.param) if exc.param is not None else ("deep", None)
    except ValueError:
        return "invalid", None


TEXT = st.text(alphabet=st.sampled_from(["a", "b", ":", '"', "\\", " ", "{", "[", "é", "\n", ","]), max_size=6)
KEYS = st.sampled_from(["a", "b", "a:", ":", 'q"', "\\", "é"])
NUMBERS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([2**63, -(2**63) - 1]),
)
# A JSON value as data: ("obj", [(key, value), ...]) may repeat a key; leaves are Python values.
TREES = st.recursive(
    st.one_of(TEXT, NUMBERS, st.booleans(), st.none()),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda items: ("arr", items)),
        st.lists(st.tuples(KEYS, inner), max_size=3).map(lambda items: ("obj", items)),
    ),
    max_leaves=12,
)


def write(tree: Any, draw_space: str, escape_colons: bool) -> str:
    """`tree` as JSON text, with `draw_space` around colons and commas, colons in strings
    optionally written as \\u003a."""

    def string(text: str) -> str:
        out = json.dumps(text, ensure_ascii=False)
        return out.replace(":", "\\u003a") if escape_colons else out

    if isinstance(tree, tuple) and tree[0] == "arr":
        return "[" + f",{draw_space}".join(write(t, draw_space, escape_colons) for t in tree[1]) + "]"
    if isinstance(tree, tuple) and tree[0] == "obj":
        items = (f"{string(k)}{draw_space}:{draw_space}{write(v, draw_space, escape_colons)}" for k, v in tree[1])
        return "{" + ",".join(items) + "}"
    if isinstance(tree, str):
        return string(tree)
    if isinstance(tree, float) and math.isfinite(tree):
        return repr(tree)
    return json.dumps(tree)


class TestFastReaderAgreesWithThePairByPairReader:
    @settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(TREES, st.sampled_from(["", " ", "\n  "]), st.booleans())
    def test_every_body_gets_the_same_value_or_the_same_refusal(self, tree, space, escape_colons):
        raw = write(tree, space, escape_colons).encode()
        assert outcome(raw) == reference(raw, LIMITS.max_depth)

    def test_a_key_dropped_while_a_string_writes_its_colon_escaped_is_still_refused(self):
        raw = b'{"a":1,"a":2,"b":"\\u003a"}'
        assert outcome(raw) == ("duplicate", "a")

    def test_an_integer_beyond_64_bits_keeps_every_digit(self):
        assert loads_strict(b'{"n": -92233720368547758090}') == {"n": -92233720368547758090}


class TestReadJson:
    def test_a_duplicate_key_is_worded_for_the_client_and_names_the_key(self):
        with pytest.raises(UnreadableJson) as caught:
            read_json(b'{"model":"a","model":"b"}')
        assert str(caught.value) == "the request body is ambiguous: the JSON has the key 'model' twice in one object"
        assert caught.value.param == "model"

    def test_text_that_is_not_json_is_worded_for_the_client(self):
        with pytest.raises(UnreadableJson, match=r"^the request body is not valid JSON: ") as caught:
            read_json(b"{not json")
        assert caught.value.param is None
