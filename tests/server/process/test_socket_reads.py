"""The serving process's event loop reads a socket a short piece at a time
(`proxy.server.process.lifecycle.short_socket_reads`), so one turn of it stays short however many
clients are sending large bodies at once."""

from __future__ import annotations

import asyncio
import asyncio.selector_events

import pytest

from proxy.server.process.lifecycle import SOCKET_READ_BYTES, short_socket_reads


class Chunks(asyncio.Protocol):
    def __init__(self, expected: int) -> None:
        self.sizes: list[int] = []
        self.expected = expected
        self.done = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.sizes.append(len(data))
        if sum(self.sizes) >= self.expected and not self.done.done():
            self.done.set_result(None)


async def received_sizes(size: int) -> list[int]:
    """The pieces a server on 127.0.0.1 is handed while a client sends `size` bytes at once."""
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[Chunks] = loop.create_future()

    def made() -> Chunks:
        protocol = Chunks(size)
        accepted.set_result(protocol)
        return protocol

    server = await loop.create_server(made, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"x" * size)
    await writer.drain()
    async with asyncio.timeout(30):
        protocol = await accepted
        await protocol.done
    writer.close()
    server.close()
    await server.wait_closed()
    return protocol.sizes


class TestShortSocketReads:
    async def test_a_large_body_reaches_the_loop_in_pieces_of_at_most_the_read_size(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        transport = asyncio.selector_events._SelectorSocketTransport
        monkeypatch.setattr(transport, "max_size", transport.max_size)  # put back after the test
        short_socket_reads()
        sizes = await received_sizes(2 * 1024 * 1024)
        assert sum(sizes) == 2 * 1024 * 1024
        assert max(sizes) <= SOCKET_READ_BYTES

    async def test_without_it_a_turn_reads_far_more(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """The control: asyncio's own read size lets one turn take many times the setting."""
        transport = asyncio.selector_events._SelectorSocketTransport
        monkeypatch.setattr(transport, "max_size", 256 * 1024)
        sizes = await received_sizes(2 * 1024 * 1024)
        assert max(sizes) > SOCKET_READ_BYTES
