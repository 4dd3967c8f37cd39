"""Dense JSON: a body's values are weighed before parsing, strings left out."""

from __future__ import annotations

import json

import pytest

from proxy.wire.codec import (
    BYTES_PER_UNIT,
    MAX_UNITS_FLOOR,
    DenseJson,
    UnreadableJson,
    check_density,
    dense_units,
    read_json,
)


class TestDenseUnits:
    def test_an_object_weighs_three_an_array_and_each_comma_one(self):
        assert dense_units(b'{"a":[1,2],"b":{}}', strings_out=True) == 3 + 1 + 1 + 1 + 3

    def test_brackets_and_commas_inside_strings_do_not_count_when_strings_are_taken_out(self):
        raw = b'{"a":"[{,\\"[{,"}'
        assert dense_units(raw, strings_out=True) == 3
        assert dense_units(raw) > 3  # the quick weighing is an upper bound

    def test_an_unterminated_string_ends_the_weighing(self):
        assert dense_units(b'[1,"never closed, [ {', strings_out=True) == 2


class TestCheckDensity:
    def test_a_body_over_the_allowed_weight_is_refused(self):
        raw = b'{"x":[' + b"[]," * MAX_UNITS_FLOOR + b"0]}"  # two units in three bytes
        with pytest.raises(DenseJson):
            check_density(raw)

    def test_a_large_text_full_of_brackets_inside_strings_is_accepted(self):
        text = '{"a": [1, 2], "b": {"c": [3]}}, ' * (2 * MAX_UNITS_FLOOR // 10)
        raw = json.dumps({"messages": [{"role": "user", "content": text}]}).encode()
        assert dense_units(raw) > MAX_UNITS_FLOOR + len(raw) // BYTES_PER_UNIT
        check_density(raw)  # no error: the brackets are text

    def test_read_json_refuses_in_the_clients_words(self):
        raw = b'{"x":[' + b"[]," * MAX_UNITS_FLOOR + b"0]}"
        with pytest.raises(UnreadableJson, match="the request body is too dense"):
            read_json(raw)
