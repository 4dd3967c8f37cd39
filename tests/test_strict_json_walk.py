"""The strict reader skips its walk over the values only when the bytes rule out what it looks for."""

from __future__ import annotations

import pytest

from proxy.wire import strict_json
from proxy.wire.strict_json import AmbiguousJson, JsonLimits, loads_strict


class TestTheWalkSkipped:
    def test_a_body_with_few_brackets_and_no_long_number_is_not_walked(self, monkeypatch):
        walked: list[object] = []
        monkeypatch.setattr(strict_json, "_shape", lambda *a, **k: walked.append(a) or (0, False))
        assert loads_strict(b'{"messages":[{"role":"user","content":"hi [x] {y}"}],"n":123456789012345678}')
        assert walked == []

    def test_an_integer_beyond_64_bits_is_read_exactly_however_few_the_brackets(self):
        assert loads_strict(b'{"n":18446744073709551616}') == {"n": 18446744073709551616}
        assert loads_strict(b"[-9223372036854775809]") == [-9223372036854775809]

    def test_a_body_nested_past_the_bound_is_refused_and_one_at_the_bound_is_read(self):
        limits = JsonLimits(max_depth=4)
        assert loads_strict(b"[[[[1]]]]", limits) == [[[[1]]]]
        with pytest.raises(AmbiguousJson, match="deeper than 4"):
            loads_strict(b"[[[[[1]]]]]", limits)

    def test_brackets_inside_strings_only_make_the_walk_run(self):
        limits = JsonLimits(max_depth=2)
        assert loads_strict(b'{"a":"[[[[{{{{"}', limits) == {"a": "[[[[{{{{"}
