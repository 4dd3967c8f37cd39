"""How much the serving process's event loop reads from a socket per turn
(`proxy.server.process.loop_lag`: `read_size`, `set_socket_read_size`, `sized_reads_on_connect`):
asyncio's own 256 KiB with a few connections, shorter reads shared among many, so that one turn
stays short however many clients are sending large bodies at once."""

from __future__ import annotations

import asyncio
import asyncio.selector_events
from collections.abc import Iterator

import pytest

from proxy.server.process.loop_lag import (
    MAX_READ_BYTES,
    MIN_READ_BYTES,
    TURN_READ_BYTES,
    LoopLag,
    LoopWatch,
    read_size,
    set_socket_read_size,
    sized_reads_on_connect,
)

TRANSPORT = asyncio.selector_events._SelectorSocketTransport


@pytest.fixture(autouse=True)
def restored(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """asyncio's read size as it was, after each test."""
    monkeypatch.setattr(TRANSPORT, "max_size", TRANSPORT.max_size)
    yield


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


class TestReadSize:
    def test_a_few_connections_read_as_asyncio_does(self) -> None:
        assert read_size(0) == read_size(1) == read_size(4) == MAX_READ_BYTES == 256 * 1024

    def test_many_connections_share_one_turn_s_reads(self) -> None:
        """Thirty-two clients: 64 KiB each; a hundred: about 20 KiB."""
        assert read_size(32) == TURN_READ_BYTES // 32 == 64 * 1024
        assert 100 * read_size(100) <= TURN_READ_BYTES

    def test_a_read_is_never_below_the_floor(self) -> None:
        """Thousands of clients sending at once: 16 KiB each, not a few bytes."""
        assert read_size(1_000) == read_size(100_000) == MIN_READ_BYTES == 16 * 1024


class TestSetSocketReadSize:
    async def test_a_large_body_reaches_the_loop_in_pieces_of_at_most_the_read_size(self) -> None:
        set_socket_read_size(MIN_READ_BYTES)
        sizes = await received_sizes(2 * 1024 * 1024)
        assert sum(sizes) == 2 * 1024 * 1024
        assert max(sizes) <= MIN_READ_BYTES

    async def test_at_asyncio_s_size_a_turn_reads_far_more(self) -> None:
        """The control: asyncio's own read size lets one read take many times the floor."""
        set_socket_read_size(MAX_READ_BYTES)
        sizes = await received_sizes(2 * 1024 * 1024)
        assert max(sizes) > MIN_READ_BYTES


class TestSizedReadsOnConnect:
    def test_a_new_connection_resizes_the_reads_after_the_server_has_noted_it(self) -> None:
        open_connections: list[object] = []
        hook = sized_reads_on_connect(open_connections.append, lambda: len(open_connections) * 50)
        hook("a connection")
        assert open_connections == ["a connection"]
        assert TRANSPORT.max_size == read_size(50)


class Clock:
    """The two calls `LoopWatch` makes of an event loop; what it schedules is kept, never run by itself."""

    def __init__(self) -> None:
        self.now = 0.0
        self.callbacks: list[object] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: object) -> Clock:
        self.callbacks.append(callback)
        return self  # the handle: only its cancel() is called

    def cancel(self) -> None:
        self.callbacks.clear()


class TestEachTick:
    def test_a_tick_sizes_the_reads_for_the_connections_open_now(self) -> None:
        """Connections that closed give the next tick asyncio's own size back."""
        clock = Clock()
        watch = LoopWatch(LoopLag(), clock)  # type: ignore[arg-type]  # the two calls it makes
        open_now = [1_000]
        watch.connections = lambda: open_now[0]
        watch.start()
        clock.callbacks.pop()()  # type: ignore[operator]
        assert TRANSPORT.max_size == MIN_READ_BYTES
        open_now[0] = 2
        clock.callbacks.pop()()  # type: ignore[operator]
        assert TRANSPORT.max_size == MAX_READ_BYTES
