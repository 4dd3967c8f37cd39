"""Whole-buffer operations a slice at a time (`proxy.core.slices`): the whole-buffer answers, each
slice a call of its own (so the GIL can change hands between them), and nothing sliced below the size."""

from __future__ import annotations

import pytest

from proxy.core import slices
from proxy.core.slices import SLICE_BYTES

MiB = 1024 * 1024


class Recording(bytes):
    """Bytes that note the range of each `count` and `find` asked of them."""

    calls: list[tuple[int | None, int | None]]

    def count(self, sub, start=None, end=None):  # type: ignore[no-untyped-def,override]
        self.calls.append((start, end))
        return super().count(sub, start, end)

    def find(self, sub, start=None, end=None):  # type: ignore[no-untyped-def,override]
        self.calls.append((start, end))
        return super().find(sub, start, end)


def recording(data: bytes) -> Recording:
    made = Recording(data)
    made.calls = []
    return made


class TestCount:
    @pytest.mark.parametrize("size", [0, 1, SLICE_BYTES - 1, SLICE_BYTES, SLICE_BYTES + 1, 3 * SLICE_BYTES + 5])
    def test_counts_what_a_whole_buffer_count_counts(self, size: int) -> None:
        """Bytes at either side of every slice boundary are each counted once."""
        data = bytearray(b"a" * size)
        for edge in range(0, size + 1, SLICE_BYTES):
            for at in (edge - 1, edge):
                if 0 <= at < size:
                    data[at : at + 1] = b":"
        assert slices.count(bytes(data), b":") == bytes(data).count(b":")

    def test_a_large_buffer_is_counted_in_calls_of_one_slice(self) -> None:
        data = recording(b"x:" * (3 * SLICE_BYTES // 2 + 7))
        assert slices.count(data, b":") == 3 * SLICE_BYTES // 2 + 7
        assert len(data.calls) == 4
        assert all(end - start == SLICE_BYTES for start, end in data.calls)  # type: ignore[operator]

    def test_a_small_buffer_is_counted_in_one_call(self) -> None:
        data = recording(b"x:" * 100)
        assert slices.count(data, b":") == 100
        assert data.calls == [(None, None)]

    def test_a_longer_pattern_is_refused(self) -> None:
        """A pattern of two bytes could straddle two slices and be missed."""
        with pytest.raises(ValueError, match="single byte"):
            slices.count(b"abc", b"ab")


class TestContains:
    @pytest.mark.parametrize("offset", [-5, -4, -3, -1, 0, 1])
    def test_finds_a_pattern_across_a_slice_boundary(self, offset: int) -> None:
        pattern = b"\\u003a"
        data = bytearray(b"a" * (2 * SLICE_BYTES + 10))
        at = SLICE_BYTES + offset
        data[at : at + len(pattern)] = pattern
        assert slices.contains(bytes(data), pattern) is True
        assert slices.contains(bytes(data), b"\\u003b") is False

    def test_a_large_buffer_is_searched_in_calls_of_about_one_slice(self) -> None:
        data = recording(b"a" * (2 * SLICE_BYTES + 10))
        assert slices.contains(data, b"zz") is False
        assert [end - start for start, end in data.calls] == [SLICE_BYTES + 1] * 3  # type: ignore[operator]

    def test_the_empty_pattern_is_in_any_buffer(self) -> None:
        assert slices.contains(b"a" * (SLICE_BYTES + 1), b"") is True

