"""`scanned_model`: a body's top-level `model`, exactly as a whole parse reads it, without the parse;
`top_level_model`: the parse for a small body, the scan for a large one."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.wire.codec import loads
from proxy.wire.top_level_model import MAX_DEPTH, PARSED_BYTES, scanned_model, top_level_model


def parsed_model(raw: bytes) -> str | None:
    """The reference the scanner is checked against, a whole parse (`proxy.wire.codec.loads`): the top-level
    `model` when it is a string, else None, and None for a body that is not JSON."""
    try:
        value = loads(raw)
    except ValueError:
        return None
    model = value.get("model") if isinstance(value, dict) else None
    return model if isinstance(model, str) else None


def nested(depth: int, inner: bytes = b"") -> bytes:
    return b"[" * depth + inner + b"]" * depth


class TestTheModelFound:
    @pytest.mark.parametrize(
        ("raw", "model"),
        [
            (b'{"model": "gpt-4o", "input": "hi"}', "gpt-4o"),
            (b'{"input": ["a", "b"], "model": "text-embedding-3-small"}', "text-embedding-3-small"),
            (b'  {\n\t"model" :\r "spaced" }  ', "spaced"),
            (b'{"model": "gpt\\u002d4o"}', "gpt-4o"),  # the value's escapes decoded as a parse decodes them
            (b'{"mod\\u0065l": "escaped key"}', "escaped key"),
            (b'{"\\u006D\\u006f\\u0064\\u0065\\u006C": "every letter escaped"}', "every letter escaped"),
            (b'{"model": "caf\\u00e9 \\ud83d\\ude00 \\"q\\" \\\\"}', 'caf\u00e9 \U0001f600 "q" \\'),
            (b'{"model": "\xc3\xa9t\xc3\xa9"}', "\u00e9t\u00e9"),
            (b'{"x": {"model": "nested"}, "model": "top"}', "top"),
            (b'{"model": "top", "x": [{"model": "nested"}, {"a": {"model": "deeper"}}]}', "top"),
            (b'{"a": "x,\\"model\\": \\"in a string\\"", "model": "real"}', "real"),
            (b'{"model": 1, "model": "last"}', "last"),  # a key twice: the last wins, as in orjson and json
            (b'{"a": NaN, "b": -Infinity, "c": 1e400, "model": "extensions"}', "extensions"),
            (b'{"big": 123456789012345678901234567890, "model": "m"}', "m"),
            (b"\xef\xbb\xbf" + b'{"model": "after a byte order mark"}', "after a byte order mark"),
            ('{"model": "utf-16"}'.encode("utf-16"), "utf-16"),
            ('{"model": "utf-32"}'.encode("utf-32-le"), "utf-32"),
            (b'{"model": "\\ud800"}', "\ud800"),  # a lone surrogate, as json.loads reads it
        ],
    )
    def test_is_the_one_a_whole_parse_reads(self, raw: bytes, model: str) -> None:
        assert parsed_model(raw) == model
        assert scanned_model(raw) == model

    @pytest.mark.parametrize(
        "raw",
        [
            b'{"input": "no model"}',
            b'{"x": {"model": "only nested"}}',
            b'[{"model": "in an array"}]',
            b'"model"',
            b'{"model": null}',
            b'{"model": 4}',
            b'{"model": ["a"]}',
            b'{"model": {"name": "a"}}',
            b'{"model": "first", "model": null}',  # the last one is not a string
            b'{"model": "first", "model": {"a": "b"}}',
        ],
    )
    def test_is_none_when_the_top_level_model_is_not_a_string(self, raw: bytes) -> None:
        assert parsed_model(raw) is None
        assert scanned_model(raw) is None


class TestABodyThatIsNotJson:
    @pytest.mark.parametrize(
        "raw",
        [
            b'{"model": "a"',
            b'{"model": "a"} trailing',
            b'{"model": "a"}{}',
            b'{"model": "a",}',
            b'{"model": "a", "x": [1, 2,]}',
            b'{"model": "a", "x": [1 2]}',
            b'{"model": "a", "x": {"b" 1}}',
            b'{"model": "a", "x": {"b": 1,}}',
            b'{"model": "a", "x": [1, "k": 2]}',
            b'{"model": "a", "x": {"b": 1, 2}}',
            b'{"model": "a", "x": [}',
            b'{"model": "a", "x": 01}',
            b'{"model": "a", "x": 1.}',
            b'{"model": "a", "x": .5}',
            b'{"model": "a", "x": -}',
            b'{"model": "a", "x": tru}',
            b'{"model": "a", "x": nan}',
            b'{"model": "a", "x": "bad \\x escape"}',
            b'{"model": "a", "x": "a raw \x01 control"}',
            b'{"model": "a", "x": "\xff not UTF-8"}',
            b'{"model": "a\xc3"}',
            b"{'model': 'a'}",
            b"",
            b"   ",
        ],
    )
    def test_reads_no_model(self, raw: bytes) -> None:
        """The guard forwarded such a body to the default upstream, untouched; it still does."""
        assert parsed_model(raw) is None
        assert scanned_model(raw) is None

    def test_nested_past_the_limit_reads_no_model(self) -> None:
        within = b'{"model": "deep", "x": ' + nested(MAX_DEPTH - 1) + b"}"
        past = b'{"model": "deep", "x": ' + nested(MAX_DEPTH) + b"}"
        assert scanned_model(within) == parsed_model(within) == "deep"
        assert scanned_model(past) is parsed_model(past) is None

    def test_nested_past_the_limit_with_values_inside_reads_no_model(self) -> None:
        """A small container read whole within its parent's run still counts as a level."""
        for depth in (MAX_DEPTH - 2, MAX_DEPTH - 1, MAX_DEPTH):
            raw = b'{"model": "deep", "x": ' + nested(depth, b'{"a": 1}') + b"}"
            assert scanned_model(raw) == parsed_model(raw), depth


class TestLargeBodies:
    def test_runs_longer_than_one_regex_call_are_read_to_the_end(self) -> None:
        members = {f"k{i}": i for i in range(10_000)}
        raw = json.dumps({**members, "x": [{"a": [1, 2]}] * 5000, "y": list(range(10_000)), "model": "m"}).encode()
        assert scanned_model(raw) == "m"
        assert scanned_model(raw.replace(b'"model": "m"', b'"model": "m",')) is None

    def test_a_container_too_large_to_read_whole_is_walked(self) -> None:
        raw = json.dumps({"x": [[{"a": list(range(200))}] * 3] * 3, "model": "m"}).encode()
        assert scanned_model(raw) == "m"


# Valid JSON objects, written in every way a client may write them (spacing, escapes, key order).
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.sampled_from(["model", "a", "b", "input"]), inner, max_size=4)
    ),
    max_leaves=30,
)
models = st.one_of(st.text(max_size=20), values)


@st.composite
def json_objects(draw: st.DrawFn) -> bytes:
    members = draw(st.lists(st.tuples(st.sampled_from(["model", "input", "x", "mode", "models"]), models), max_size=6))
    ascii_only = draw(st.booleans())
    spaced = draw(st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]))
    # Written by hand so that a key may come twice, as a client may send it.
    parts = [
        json.dumps(key, ensure_ascii=ascii_only)
        + spaced[1]
        + json.dumps(value, ensure_ascii=ascii_only, separators=(spaced[0], spaced[1]))
        for key, value in members
    ]
    return ("{" + spaced[0].join(parts) + "}").encode("utf-8")


class TestAgainstAWholeParse:
    @given(json_objects())
    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    def test_finds_what_orjson_reads(self, raw: bytes) -> None:
        value: Any = orjson.loads(raw)
        model = value.get("model")
        assert scanned_model(raw) == (model if isinstance(model, str) else None)

    @given(json_objects(), st.data())
    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    def test_a_damaged_body_reads_as_a_whole_parse_reads_it(self, raw: bytes, data: st.DataObject) -> None:
        """Cut short, or a byte changed, inserted or removed: the same model or None as the parse."""
        at = data.draw(st.integers(min_value=0, max_value=len(raw)))
        byte = data.draw(st.sampled_from(list(b'{}[]",:\\ 0aetnN-.')) | st.integers(0, 255)).to_bytes(1, "big")
        damage = data.draw(st.sampled_from(["cut", "change", "insert", "remove"]))
        if damage == "cut":
            damaged = raw[:at]
        elif damage == "change":
            damaged = raw[:at] + byte + raw[at + 1 :]
        elif damage == "insert":
            damaged = raw[:at] + byte + raw[at:]
        else:
            damaged = raw[:at] + raw[at + 1 :]
        assert scanned_model(damaged) == parsed_model(damaged)


class TestTopLevelModel:
    def test_parses_a_small_body_and_scans_a_large_one_to_the_same_model(self) -> None:
        small = json.dumps({"input": "x" * 100, "model": "m"}).encode()
        large = json.dumps({"input": "x" * PARSED_BYTES, "model": "m"}).encode()
        assert len(small) <= PARSED_BYTES < len(large)
        assert top_level_model(small) == top_level_model(large) == "m"

    @pytest.mark.parametrize("size", [10, PARSED_BYTES + 10])
    def test_reads_no_model_in_a_body_that_is_not_json_whatever_its_size(self, size: int) -> None:
        assert top_level_model(b'{"model": "m", "x": "' + b"x" * size + b'"') is None
