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
        headers = {"Host": f"127.0.0.1:{port}", **(headers or {}), "Connection": "close"}
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
