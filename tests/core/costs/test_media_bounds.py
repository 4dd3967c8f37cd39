"""Hostile files cost linear work, and their page counts are never below what the page trees state.

The oracle for page trees is the pattern used before (`OLD_COUNT`, quadratic on long dictionaries,
so only run on small inputs): every count it paired, the scan pairs too.
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.costs.media import FILE_INFLATE_CAP, _pdf_bound, _zip_bound
from proxy.core.costs.pdf_pages import PAGES_MOST

OLD_COUNT = re.compile(rb"/Type\s*/Pages\b[^>]*?/Count\s+(\d{1,9})|/Count\s+(\d{1,9})[^>]*?/Type\s*/Pages\b")
OLD_PAGE = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")
TOKENS = [b"/Type/Pages", b"/Type /Pages", b"/Type/Page", b"/Type\n/Page ", b"/Count 3", b"/Count 12", b"/Count",
          b"/Count x", b">", b">>", b"<<", b" ", b"\n", b"/Kids [1 0 R]", b"/Pagesx", b"/Count 123456789"]  # fmt: skip
pdf_text = st.lists(st.sampled_from(TOKENS), max_size=60).map(b"".join)


def stream(data: bytes) -> bytes:
    return b"stream\n" + zlib.compress(data) + b"\nendstream\n"


def old_pages(raw: bytes, inflated: list[bytes]) -> int:
    objects, counts = 0, [0]
    for text in (raw, *inflated):
        objects += len(OLD_PAGE.findall(text))
        counts += (int(a or b) for a, b in OLD_COUNT.findall(text))
    return max(1, objects, *counts)


class TestPdfBound:
    @settings(max_examples=300, deadline=None)
    @given(pdf_text, st.lists(pdf_text, max_size=3))
    def test_pages_are_never_below_what_the_page_trees_state(self, head: bytes, streams: list[bytes]) -> None:
        raw = head + b"".join(stream(s) for s in streams)
        pages, text_bytes, capped = _pdf_bound(raw)
        assert pages >= min(old_pages(raw, streams), PAGES_MOST)  # past it, a count says only "over"
        assert text_bytes == len(raw) + sum(map(len, streams)) and not capped

    @given(st.integers(1, 2000))
    def test_streams_started_inside_streams_cost_a_bounded_feed(self, nested: int) -> None:
        data = zlib.compress(b"/Type/Page " * 5)
        raw = b"stream\n" * nested + data + b"\nendstream\n"
        pages, text_bytes, capped = _pdf_bound(raw)
        # Each start is fed up to the one `endstream`: past 4 bytes fed per byte of the file, the cap.
        fed = sum(len(raw) - len(b"\nendstream\n") - 7 * (i + 1) for i in range(nested))
        assert capped == (fed > 4 * len(raw))
        assert text_bytes == len(raw) + (FILE_INFLATE_CAP if capped else 0) or pages == 5

    def test_a_page_tree_with_no_count_and_no_end_is_read_at_the_cap(self) -> None:
        """The 789-byte body that froze the loop: its page tree never closes and states no count."""
        payload = (b"/Type/Pages " * (FILE_INFLATE_CAP // 12 + 1))[:FILE_INFLATE_CAP]
        raw = b"%PDF-1.7\n" + stream(payload)
        pages, text_bytes, capped = _pdf_bound(raw)
        assert pages == 1 and capped and text_bytes == len(raw) + FILE_INFLATE_CAP


def zipped(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


class TestZipBound:
    @settings(max_examples=100, deadline=None)
    @given(st.dictionaries(st.text("abcxyz/", min_size=1, max_size=8), st.binary(max_size=4096), max_size=8))
    def test_a_document_counts_at_least_its_members_inflated(self, members: dict[str, bytes]) -> None:
        raw = zipped(members)
        pages, text_bytes, capped = _zip_bound(raw)
        assert pages == 1 and text_bytes >= len(raw) + sum(map(len, members.values())) and not capped

    def test_a_zip_bomb_stops_at_the_cap(self) -> None:
        raw = zipped({f"m{i}.xml": bytes(FILE_INFLATE_CAP // 2) for i in range(3)})
        assert _zip_bound(raw) == (1, len(raw) + FILE_INFLATE_CAP, True)

    @given(st.binary(max_size=256))
    def test_damaged_archives_count_their_bytes(self, tail: bytes) -> None:
        raw = b"PK\x03\x04" + tail
        assert _zip_bound(raw)[1] >= len(raw)
