"""JSON parsing never changes a value, whatever the parser underneath."""

from __future__ import annotations

import pytest

from proxy.wire.codec import dumps, loads


class TestCodec:
    def test_integers_beyond_64_bits_stay_exact(self):
        assert loads(b'{"n": 123456789012345678901234567890}') == {"n": 123456789012345678901234567890}
        assert loads(dumps({"n": 2**70})) == {"n": 2**70}

    def test_nan_and_infinity_extensions_parse(self):
        value = loads(b'{"a": NaN, "b": Infinity}')
        assert value["b"] == float("inf") and value["a"] != value["a"]

    def test_long_digit_strings_are_just_strings(self):
        assert loads(b'{"id": "12345678901234567890123"}') == {"id": "12345678901234567890123"}

    @pytest.mark.parametrize("raw", [b"{", b"", b"\xff", b'{"a": }'])
    def test_invalid_json_is_a_value_error(self, raw):
        with pytest.raises(ValueError):
            loads(raw)
