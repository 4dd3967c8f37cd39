"""The strict reader skips its walk over the values only when the bytes rule out what it looks for."""

from __future__ import annotations

import re
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.wire import codec
from proxy.wire.codec import AmbiguousJson, JsonLimits, loads_strict


class TestTheWalkSkipped:
    def test_a_body_with_few_brackets_and_no_long_number_is_not_walked(self, monkeypatch):
        walked: list[object] = []
        monkeypatch.setattr(codec, "_shape", lambda *a, **k: walked.append(a) or (0, False))
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


class TestLongNumbers:
    """The bytes that may hold an integer beyond 64 bits: a run of 19 ASCII digits, wherever it is."""

    RUN = re.compile(rb"[0-9]{19}")  # what the check stands for

    @given(
        st.lists(st.one_of(st.binary(max_size=12), st.text("0123456789", max_size=30).map(str.encode)), max_size=40),
        st.sampled_from([19, 20, 37, 64]),
    )
    def test_a_run_of_nineteen_digits_is_found_in_any_bytes_across_any_slice(self, pieces, size):
        raw = b"".join(pieces)
        with mock.patch.object(codec, "_DIGIT_SLICE", size):
            assert codec.has_long_number(raw) == bool(self.RUN.search(raw))

    def test_a_run_across_the_slices_of_a_large_body_is_found(self):
        head = b'{"a":"' + b"x" * (64 * 1024 - 17) + b'","n":'  # the digits start 5 bytes before the first cut
        body = head + b"1" * 19 + b"}"
        assert len(head) == 64 * 1024 - 5 and codec.has_long_number(body)
        assert not codec.has_long_number(head + b"1" * 18 + b"}")
