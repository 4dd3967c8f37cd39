"""A raw HTTP/1.1 client for the hardening tests: it sends the request target and bytes exactly as
given (HTTP client libraries normalise paths and fix up bodies, which is what these tests must not
rely on), and reads the answer until it is complete or the server closes the connection."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from multidict import CIMultiDict


@dataclass
class RawResponse:
    status: int
    headers: CIMultiDict[str] = field(default_factory=CIMultiDict)
    body: bytes = b""
    complete: bool = True  # False when the connection closed before the announced length

    def json(self) -> Any:
        return json.loads(self.body)


async def raw_request(
    port: int,
    method: str,
    target: str,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
    *,
    content_length: int | None = None,
    send_body: bool = True,
    timeout: float = 10.0,
) -> RawResponse:
    """Send one request on a fresh connection to 127.0.0.1:`port` and read the whole answer.
    `content_length` announces a length other than the body's; `send_body=False` sends headers only."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        headers = {"Host": f"127.0.0.1:{port}", "Connection": "close", **(headers or {})}
        lines = [f"{method} {target} HTTP/1.1"] + [f"{name}: {value}" for name, value in headers.items()]
        if body or content_length is not None:
            lines.append(f"Content-Length: {len(body) if content_length is None else content_length}")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if send_body:
            writer.write(body)
        await writer.drain()
        return await asyncio.wait_for(read_response(reader), timeout)
    finally:
        writer.close()


async def read_response(reader: asyncio.StreamReader) -> RawResponse:
    """Read until the response is whole (its length, or its last chunk) or the connection ends."""
    data = b""
    while True:
        chunk = await reader.read(65536)
        data += chunk
        if b"\r\n\r\n" in data:
            response = parse_response(data)
            framed = "Content-Length" in response.headers or "chunked" in response.headers.get("Transfer-Encoding", "")
            if framed and response.complete:
                return response
        if not chunk:
            return parse_response(data)


def parse_response(data: bytes) -> RawResponse:
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers: CIMultiDict[str] = CIMultiDict()
    for line in header_lines:
        name, _, value = line.partition(":")
        headers.add(name.strip(), value.strip())
    response = RawResponse(int(status_line.split()[1]), headers)
    if headers.get("Transfer-Encoding", "").lower() == "chunked":
        response.body, response.complete = _dechunk(rest)
    elif "Content-Length" in headers:
        length = int(headers["Content-Length"])
        response.body, response.complete = rest[:length], len(rest) >= length
    else:
        response.body = rest
    return response


def _dechunk(data: bytes) -> tuple[bytes, bool]:
    out = bytearray()
    while True:
        size_line, sep, data = data.partition(b"\r\n")
        if not sep:
            return bytes(out), False
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            return bytes(out), True
        if len(data) < size + 2:
            return bytes(out + data[:size]), False
        out += data[:size]
        data = data[size + 2 :]


class RawUpstream:
    """An upstream on 127.0.0.1 that answers every request with `reply` (raw bytes, sent as they
    are), then closes, or with `hang=True` keeps the connection open without another byte."""

    def __init__(self, reply: bytes, *, hang: bool = False) -> None:
        self.reply = reply
        self.hang = hang
        self.requests: list[bytes] = []
        self.server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> RawUpstream:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next(
                (
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ),
                0,
            )
            self.requests.append(head + await reader.readexactly(length))
            writer.write(self.reply)
            await writer.drain()
            if self.hang:
                await asyncio.sleep(3600)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
