"""A large body parsed with its long strings decoded a piece at a time (`proxy.wire.long_strings`,
and `proxy.wire.codec.loads_strict` above `SLICED_BODY_BYTES`): orjson's value and refusals, each
piece a call of its own."""

from __future__ import annotations

import json
import random
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from proxy.wire import codec, long_strings
from proxy.wire.codec import AmbiguousJson, loads_strict
from proxy.wire.long_strings import sliced_loads

# Characters whose writing a cut must not split: escapes (one of six bytes), two- to four-byte
# UTF-8, a surrogate pair written as two escapes (the emoji, where ASCII is asked for), quotes and
# backslashes escaped.
PIECES = ["a", "é", "😀", "中文", "\\", '"', "\n", ":", " ", "x" * 20, "\u2028", "\x7f"]


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strings of 8 bytes count as long, pieces are 16 bytes, a scan 7: every boundary is met."""
    monkeypatch.setattr(long_strings, "LONG_STRING_BYTES", 8)
    monkeypatch.setattr(long_strings, "PIECE_BYTES", 16)
    monkeypatch.setattr(long_strings, "SCAN_BYTES", 7)
    monkeypatch.setattr(long_strings.long_strings, "__defaults__", (8,))


def bodies(count: int) -> list[bytes]:
    rng = random.Random(5)
    made = []
    for _ in range(count):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 40)))
        value: Any = {
            "model": "m",
            "k" * rng.randint(1, 30): [{"role": "user", "content": text} for _ in range(rng.randint(0, 3))],
            "n": [1, 2.5, None, True, ["y" * rng.randint(0, 12)]],
        }
        if rng.random() < 0.1:
            value = text  # a body that is one string
        made.append(json.dumps(value, ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1])).encode())
    return made


@pytest.mark.usefixtures("tiny")
class TestSlicedLoads:
    def test_reads_every_body_as_orjson_does(self) -> None:
        for raw in bodies(1500):
            value, keys_kept = sliced_loads(raw)
            assert value == orjson.loads(raw), raw
            assert keys_kept

    def test_finds_long_string_values_but_not_keys(self) -> None:
        raw = b'{"a_key_that_is_long": "a value that is long", "n": "short"}'
        spans = long_strings.long_strings(raw)
        assert [raw[s:e] for s, e in spans or ()] == [b'"a value that is long"']

    @pytest.mark.parametrize(
        "raw",
        [
            b'{"a": "\\ud800 and more after the lone half"}',
            b'{"a": "a control character \x01 in a long string"}',
            b'{"a": "bytes that are not UTF-8 \xff in a long string"}',
            b'{"a": "an escape that JSON does not have \\q in it"}',
            b'{"a": "a long string that never closes',
            b'{"a": "a long string", }',
        ],
    )
    def test_refuses_what_orjson_refuses(self, raw: bytes) -> None:
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(raw)
        with pytest.raises(orjson.JSONDecodeError):
            sliced_loads(raw)

    def test_says_when_a_key_was_written_twice(self) -> None:
        raw = b'{"a": "the first long value", "a": "the second long value"}'
        assert sliced_loads(raw)[1] is False

    def test_decodes_a_long_string_in_pieces(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Each piece is one orjson call of at most a piece and a cut's reach."""
        sizes: list[int] = []

        def loads(data: bytes) -> Any:
            sizes.append(len(data))
            return orjson.loads(data)

        monkeypatch.setattr(long_strings, "orjson", SimpleNamespace(loads=loads, dumps=orjson.dumps))
        text = "word, " * 40
        assert sliced_loads(json.dumps({"content": text}).encode())[0] == {"content": text}
        pieces = sizes[1:]  # after the body with the string taken out
        assert len(pieces) > 10
        assert max(pieces) <= long_strings.PIECE_BYTES + 2 + 7


    def test_a_long_string_that_is_not_ascii_is_decoded_whole(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Pieced, it would be held twice while they are joined: more than the memory bound allows
        for text of two or three bytes a character."""
        sizes: list[int] = []

        def loads(data: bytes) -> Any:
            sizes.append(len(data))
            return orjson.loads(data)

        monkeypatch.setattr(long_strings, "orjson", SimpleNamespace(loads=loads, dumps=orjson.dumps))
        raw = json.dumps({"content": "中文字符, " * 40}, ensure_ascii=False).encode()
        assert sliced_loads(raw)[0] == orjson.loads(raw)
        assert sizes == [len(raw)]


class TestLoadsStrictSliced:
    """`loads_strict` on a body above `SLICED_BODY_BYTES` answers as on a smaller one."""

    @pytest.mark.parametrize(
        "raw",
        [
            b'{"messages": [{"role": "user", "content": "a long text with a colon: here"}], "n": 1}',
            b'{"a": "a long text with an escaped \\u003a colon", "a": 2}',
            b'{"model": "m", "x": 123456789012345678901234567890, "t": "a long text beside it"}',
            b'{"a": "a long text", "deep": ' + b"[" * 70 + b"]" * 70 + b"}",
            # past orjson's own bound for writing back (254): read, but not written back
            b'{"a": "a long text", "deep": ' + b"[" * 300 + b"]" * 300 + b"}",
            b'{"a": "short", "deep": ' + b"[" * 300 + b"]" * 300 + b"}",
        ],
    )
    def test_the_same_value_or_the_same_refusal(self, raw: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
        try:
            expected: Any = loads_strict(raw)
        except AmbiguousJson as error:
            expected = str(error)
        monkeypatch.setattr(codec, "SLICED_BODY_BYTES", 0)
        monkeypatch.setattr(long_strings.long_strings, "__defaults__", (8,))
        monkeypatch.setattr(long_strings, "PIECE_BYTES", 16)
        try:
            got: Any = loads_strict(raw)
        except AmbiguousJson as error:
            got = str(error)
        assert got == expected

    def test_a_duplicate_long_key_value_is_refused_by_name(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(codec, "SLICED_BODY_BYTES", 0)
        monkeypatch.setattr(long_strings.long_strings, "__defaults__", (8,))
        with pytest.raises(AmbiguousJson, match="'content' twice"):
            loads_strict(b'{"content": "the first long value", "content": "the second long value"}')
