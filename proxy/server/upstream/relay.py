"""An upstream's answer relayed to the client chunk by chunk as it arrives, compressed bytes and all.

An upstream body that ends before its announced length aborts the client's connection, so the
client sees a broken response instead of waiting forever; a broken event stream ends with an error
event in the client's API's grammar."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from proxy.apis.base import AnswerAmendment
from proxy.apis.stream_errors import openai_broken
from proxy.server.edge.paths import PATH_ROUTE
from proxy.server.request.flow import Flow
from proxy.server.upstream.headers import response_headers
from proxy.server.upstream.sse import is_event_stream


@dataclass
class Relayed:
    response: web.StreamResponse
    broken: str | None = None  # why the upstream stream ended early, if it did
    client_gone: bool = False


async def relay(
    flow: Flow,
    response: aiohttp.ClientResponse,
    extra_headers: Mapping[str, str],
    chunks: AsyncIterator[bytes] | None = None,
) -> Relayed:
    """Stream `response` to `flow`'s client as it arrives (or `chunks`, when given: its body, already
    begun or filtered; see `proxy.server.upstream.answers`). A client that goes away ends the relay
    (and, by leaving the upstream call, closes the upstream connection). An upstream that breaks
    mid-stream ends an event stream cleanly, with an SSE error event (in the grammar of the
    client's API, the flow record's `kind`) then EOF; any other body
    (or an event stream of announced length) is cut off by closing the client's connection, so
    that a half response can never pass for a whole one."""
    # The headers go out with the first bytes (one write, not two) unless this is an event stream
    # relayed from its very start: then they are sent at once, as the upstream sent its own.
    eager = chunks is None and is_event_stream(response)
    out = (web.StreamResponse if eager else _HeadersWithFirstBytes)(status=response.status, reason=response.reason)
    out.headers.update(response_headers(response.headers))
    out.headers.update(extra_headers)
    amendment = _amendment(flow, response)
    if response.content_length is not None and amendment is None:  # a whole body keeps its length; streams stay chunked
        out.content_length = response.content_length
    request = flow.request
    await out.prepare(request)
    relayed = Relayed(out)
    source = response.content.iter_any() if chunks is None else chunks
    try:
        async for chunk in source if amendment is None else _amended(source, amendment):
            await out.write(chunk)
    except ConnectionResetError:
        relayed.client_gone = True
        return relayed
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        relayed.broken = f"upstream {flow.target.upstream.name!r} ended the stream early ({type(exc).__name__})"
        if not is_event_stream(response) or out.content_length is not None:
            abort(request)
            return relayed
        endpoint = request[PATH_ROUTE].endpoint  # a pass-through path has none: OpenAI's event
        event = (endpoint.adapter.broken_stream_event if endpoint else openai_broken)(relayed.broken)
        with contextlib.suppress(ConnectionResetError):
            await out.write(event)
    with contextlib.suppress(ConnectionResetError):
        await out.write_eof()
    return relayed


def _amendment(flow: Flow, response: aiohttp.ClientResponse) -> AnswerAmendment | None:
    """What writes into a successful answer the fields the guard adds to it (what its own context
    edits cleared, for an upstream that cannot edit: `Plan.answer`), in the client's API's shape;
    None when it adds none. A compressed answer is relayed as it came."""
    exchange = flow.exchange
    plan = exchange.plan if exchange is not None else None
    if plan is None or not plan.answer or response.status >= 400:
        return None
    if response.headers.get("Content-Encoding", "identity").lower() != "identity":
        return None
    return flow.endpoint.adapter.answer_amendment(plan.answer, is_event_stream(response))


async def _amended(chunks: AsyncIterator[bytes], amendment: AnswerAmendment) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        out = amendment.feed(chunk)
        if out:
            yield out
    rest = amendment.finish()
    if rest:
        yield rest


class _HeadersWithFirstBytes(web.StreamResponse):
    """A relayed response whose status line and headers are written together with its first body
    bytes, as aiohttp's own `web.Response` does (its `_send_headers_immediately`): on loopback
    each write costs a system call and the receiver's wake-up. A body that never comes still
    gets its headers, with the end of the response."""

    _send_headers_immediately = False


def abort(request: web.Request) -> None:
    """Close the client's connection now, mid-response: the client sees a truncated body."""
    request.protocol.force_close()
    if request.transport is not None:
        request.transport.close()
