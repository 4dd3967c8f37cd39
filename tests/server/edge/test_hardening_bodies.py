"""Request bodies: compressed ones are checked, capped, counted and forwarded decoded; slow ones time out."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gzip
import json
import tracemalloc
import zlib
from collections.abc import Callable

import pytest

from proxy.errors import BadRequest, PayloadTooLarge, UnsupportedEncoding
from proxy.server.backends.models import Models
from proxy.server.edge import body as body_module
from proxy.server.edge.body import BodyPolicy, content_encoding, inflate
from proxy.server.process.app import create_app
from tests.server.conftest import gateway_settings
from tests.server.raw_http import raw_request, read_response

CHAT = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi " * 500}]}).encode()
MiB = 1024 * 1024


@functools.cache
def bomb(inflated_bytes: int) -> bytes:
    """A gzip member of `inflated_bytes` zeros: about a thousandth of that on the wire."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(MiB)
    parts = [compressor.compress(block) for _ in range(inflated_bytes // MiB)]
    return b"".join([*parts, compressor.flush()])


def raw_deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


class TestContentEncoding:
    @pytest.mark.parametrize(
        ("header", "expected"), [(None, None), ("identity", None), ("GZip", "gzip"), ("deflate", "deflate")]
    )
    def test_known_encodings_are_recognised(self, header, expected):
        assert content_encoding(header) == expected

    @pytest.mark.parametrize("header", ["br", "zstd", "compress", "gzip, gzip", "deflate, gzip"])
    def test_unknown_or_stacked_encodings_are_415(self, header):
        with pytest.raises(UnsupportedEncoding):
            content_encoding(header)


class TestInflate:
    @pytest.mark.parametrize(
        ("data", "encoding"),
        [
            (gzip.compress(CHAT), "gzip"),
            (gzip.compress(CHAT[:100]) + gzip.compress(CHAT[100:]), "gzip"),
            (zlib.compress(CHAT), "deflate"),
            (raw_deflate(CHAT), "deflate"),
        ],
    )
    def test_gzip_members_and_both_deflate_spellings_decode(self, data, encoding):
        assert inflate(data, encoding, len(CHAT)) == CHAT

    def test_a_bomb_stops_at_the_cap_without_inflating_past_it(self):
        data = bomb(256 * MiB)
        tracemalloc.start()
        try:
            with pytest.raises(PayloadTooLarge):
                inflate(data, "gzip", MiB)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 4 * MiB

    @pytest.mark.parametrize(
        ("data", "reason"),
        [
            (b"not gzip at all", "not valid gzip"),
            (gzip.compress(CHAT)[:-20], "truncated"),
            (zlib.compress(CHAT) + b"junk", "after its deflate stream"),
        ],
    )
    def test_corrupt_data_is_a_400(self, data, reason):
        with pytest.raises(BadRequest, match=reason):
            inflate(data, "deflate" if b"junk" in data else "gzip", MiB)


class TestBodyPolicy:
    @pytest.mark.parametrize("timeout", [0, -1, "30"])
    def test_a_bad_read_timeout_is_a_value_error(self, timeout):
        with pytest.raises(ValueError, match="body_timeout_seconds"):
            BodyPolicy(read_timeout=timeout)


class TestCompressedBodiesOverSockets:
    @pytest.mark.parametrize(
        ("encode", "name"), [(gzip.compress, "gzip"), (zlib.compress, "deflate"), (raw_deflate, "deflate")]
    )
    async def test_a_compressed_chat_body_is_counted_and_forwarded_decoded(self, proxy, upstream, encode, name):
        response = await raw_request(
            proxy.port,
            "POST",
            "/v1/chat/completions",
            encode(CHAT),
            {"Content-Type": "application/json", "Content-Encoding": name},
        )
        assert response.status == 200 and int(response.headers["x-context-guard-tokens-before"]) > 500
        received = upstream.received[-1]
        assert received.body == CHAT and "Content-Encoding" not in received.headers
        assert int(received.headers["Content-Length"]) == len(CHAT)

    async def test_a_compressed_pass_through_body_is_forwarded_decoded(self, proxy, upstream):
        payload = b'{"input": "embed me"}'
        response = await raw_request(
            proxy.port,
            "POST",
            "/v1/embeddings",
            gzip.compress(payload),
            {"Content-Type": "application/json", "Content-Encoding": "gzip"},
        )
        assert response.status == 200 and upstream.received[-1].body == payload
        assert "Content-Encoding" not in upstream.received[-1].headers

    async def test_an_unsupported_encoding_is_415_and_reaches_nothing(self, proxy, upstream):
        response = await raw_request(
            proxy.port, "POST", "/v1/chat/completions", b"\x00\x01", {"Content-Encoding": "br"}
        )
        assert response.status == 415 and response.json()["error"]["code"] == "unsupported_content_encoding"
        assert upstream.received == []

    async def test_a_bomb_from_an_unauthorised_client_is_never_inflated(self, start_proxy, upstream, monkeypatch):
        inflated: list[int] = []
        monkeypatch.setattr(body_module, "inflate", lambda data, *args: inflated.append(len(data)) or b"")
        proxy = await start_proxy(
            gateway_settings(upstream.url, server={"client_keys": ["cg-key"], "max_body_bytes": MiB})
        )
        headers = {"Content-Encoding": "gzip", "Authorization": "Bearer wrong"}
        response = await raw_request(proxy.port, "POST", "/v1/chat/completions", bomb(256 * MiB), headers)
        assert response.status == 401 and inflated == [] and upstream.received == []

    async def test_a_bomb_gets_413_fast_and_the_server_keeps_serving(self, start_proxy, upstream, monkeypatch):
        """Fast: it is inflated only up to the body limit (`inflate_within` stops there, see test_body_decoding)."""
        limits: list[int] = []
        inflate = body_module.inflate

        def asked(data: bytes, encoding: str, limit: int, charge: Callable[[int], None] | None = None) -> bytes:
            limits.append(limit)
            return inflate(data, encoding, limit, charge)

        monkeypatch.setattr(body_module, "inflate", asked)
        proxy = await start_proxy(gateway_settings(upstream.url, server={"max_body_bytes": MiB}))
        data = bomb(256 * MiB)
        response = await raw_request(proxy.port, "POST", "/v1/chat/completions", data, {"Content-Encoding": "gzip"})
        assert response.status == 413 and response.json()["error"]["code"] == "request_too_large"
        assert limits == [MiB] and upstream.received == []
        assert (await raw_request(proxy.port, "GET", "/healthz")).status == 200

    async def test_corrupt_gzip_is_a_400(self, proxy, upstream):
        response = await raw_request(
            proxy.port, "POST", "/v1/chat/completions", b"garbage", {"Content-Encoding": "gzip"}
        )
        assert response.status == 400 and "gzip" in response.json()["error"]["message"]


class TestSlowBodies:
    @pytest.fixture
    async def impatient_proxy(self, aiohttp_server, model_map, upstream):
        settings = gateway_settings(upstream.url)
        settings = dataclasses.replace(settings, server=dataclasses.replace(settings.server, body_timeout_seconds=0.5))
        return await aiohttp_server(create_app(settings, Models(settings, model_map)))

    async def test_a_half_sent_body_gets_408_and_the_connection_is_closed(self, impatient_proxy, upstream):
        """The rest of the body never comes: only the proxy's deadline can answer (raw_request waits 10 s)."""
        response = await raw_request(
            impatient_proxy.port,
            "POST",
            "/v1/chat/completions",
            CHAT[:10],
            {"Content-Type": "application/json"},
            content_length=len(CHAT),
        )
        assert response.status == 408 and response.json()["error"]["code"] == "request_timeout"
        assert response.headers["Connection"] == "close"
        assert upstream.received == []

    async def test_a_body_trickled_past_the_deadline_gets_408(self, impatient_proxy, upstream):
        reader, writer = await asyncio.open_connection("127.0.0.1", impatient_proxy.port)
        writer.write(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(CHAT)}\r\n\r\n".encode())
        for i in range(0, 40):
            writer.write(CHAT[i : i + 1])
            await writer.drain()
            await asyncio.sleep(0.05)  # a slow client's pace: the deadline under test runs on the server's real clock
            if reader.at_eof() or reader._buffer:  # the answer came: stop trickling
                break
        response = await asyncio.wait_for(read_response(reader), 5)
        writer.close()
        assert response.status == 408 and upstream.received == []
