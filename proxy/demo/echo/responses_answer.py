"""The echo's answer in the Responses API's shape (`POST /v1/responses`), whole or streamed.

A stream is the event sequence OpenAI sends for one text output: `response.created`,
`response.in_progress`, `response.output_item.added`, `response.content_part.added`,
`response.output_text.delta` per few words, `response.output_text.done`,
`response.content_part.done`, `response.output_item.done`, `response.completed` (which carries
the whole response, with its usage and the report as `echo`). Every event has its
`sequence_number`. `previous_response_id` is accepted and echoed; the echo keeps no state. The
response and its events are built by `proxy.demo.provider_answers`, as every fake upstream builds
them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from proxy.demo import provider_answers as answers
from proxy.demo.echo.report import Reply
from proxy.demo.event_stream import send_stream


def _repeated(body: Mapping[str, Any]) -> dict[str, Any]:
    """What a Response repeats of its request."""
    return {
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "text": body.get("text") or {"format": {"type": "text"}},
    }


async def responses(request: web.Request, body: Mapping[str, Any], reply: Reply) -> web.StreamResponse:
    ids = f"echo{reply.suffix}"
    item = answers.response_item(reply.text, ids=ids)
    fields = {"ids": ids, "created": reply.created, "usage": reply.usage, "every_field": True, **_repeated(body)}
    fields["previous_response_id"] = body.get("previous_response_id")
    if body.get("stream") is not True:
        return web.json_response({**answers.response(reply.model, [item], **fields), "echo": reply.echo})
    events = answers.response_events(reply.model, item, pieces=reply.pieces, part_events=True, **fields)
    _, completed = events[-1]
    completed["response"]["echo"] = reply.echo
    return await send_stream(request, answers.frames(events))
