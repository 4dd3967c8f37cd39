"""Helpers for tests of relayed streams: the async-iterator plumbing the guard itself does
inside `proxy.server.upstream.relay.UsageReader`, spelled out for tests that drive the parts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp

from proxy.server.upstream.usage import UsageTap


async def replay(head: bytes, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The bytes `peek_first_event()` read, then the rest of the response as it arrives."""
    if head:
        yield head
    async for chunk in response.content.iter_any():
        yield chunk


async def tapped(chunks: AsyncIterator[bytes], tap: UsageTap) -> AsyncIterator[bytes]:
    """`chunks` through `tap`: usage recorded, the usage chunk dropped if the tap strips it."""
    async for chunk in chunks:
        out = tap.feed(chunk)
        if out:
            yield out
    rest = tap.finish()
    if rest:
        yield rest
