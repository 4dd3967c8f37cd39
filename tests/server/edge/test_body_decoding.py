"""The one content decoder: strict and bounded for request bodies, lenient and bounded for reading
upstream answers and error bodies."""

from __future__ import annotations

import gzip
import zlib

import pytest

from proxy.server.edge.body import Decoder, Oversized, Undecodable, decoded, inflate_within
from proxy.server.upstream.connection import MAX_DECODED_ERROR_BODY
from proxy.server.upstream.connection import decoded as error_body_decoded

TEXT = b'{"error": {"message": "too long"}}'


def bomb(inflated_bytes: int) -> bytes:
    """A gzip member of `inflated_bytes` zeros, about a thousandth of that compressed."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1024 * 1024)
    return b"".join(compressor.compress(block) for _ in range(inflated_bytes // len(block))) + compressor.flush()


class TestInflate:
    def test_gzip_x_gzip_and_both_deflates_decode(self):
        raw = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
        raw_deflate = raw.compress(TEXT) + raw.flush()
        for data, coding in [(gzip.compress(TEXT), "gzip"), (gzip.compress(TEXT), "x-gzip"),
                             (zlib.compress(TEXT), "deflate"), (raw_deflate, "deflate")]:  # fmt: skip
            assert inflate_within(data, coding, len(TEXT)) == TEXT

    def test_output_past_the_limit_is_refused_one_byte_past_it(self):
        with pytest.raises(Oversized, match="more than the limit of 1,048,576 bytes"):
            inflate_within(bomb(8 * 1024 * 1024), "gzip", 1024 * 1024)

    def test_corrupt_data_says_what_it_is_not(self):
        with pytest.raises(Undecodable, match=r"^is not valid gzip data"):
            inflate_within(b"not gzip at all", "gzip", 1024)


class TestLenientReading:
    def test_a_decoder_inflates_at_most_what_each_call_allows(self):
        assert len(Decoder("gzip")(bomb(4 * 1024 * 1024), 1000)) == 1000

    def test_what_does_not_decode_is_read_as_it_came(self):
        decode = Decoder("gzip")
        assert decode(b"plain text") == b"plain text" and decode(b"more") == b"more"

    def test_an_unknown_or_absent_coding_is_read_as_it_came(self):
        assert decoded(TEXT, "br", 10) == TEXT and decoded(TEXT, None, 10) == TEXT

    def test_a_whole_body_is_inflated_up_to_its_limit(self):
        assert decoded(gzip.compress(TEXT), " GZIP ", 1000) == TEXT
        assert decoded(zlib.compress(TEXT), "deflate", 5) == TEXT[:5]

    def test_an_upstream_error_body_is_read_bounded_however_far_it_inflates(self):
        """A 1 MiB compressed error body could inflate to a gigabyte; its message is near the start."""
        assert len(error_body_decoded(bomb(64 * 1024 * 1024), "gzip")) == MAX_DECODED_ERROR_BODY
        assert error_body_decoded(gzip.compress(TEXT), "gzip") == TEXT
