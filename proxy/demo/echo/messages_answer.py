"""The echo's answer in Anthropic's Messages shape (`POST /v1/messages`), whole or streamed.

A stream is Anthropic's named events: `message_start`, `content_block_start`,
`content_block_delta` (text deltas) per few words, `content_block_stop`, `message_delta` (the
stop reason, the output tokens and the report as `echo`), `message_stop`, built by
`proxy.demo.provider_answers` as every fake upstream builds them. Errors on these paths take
Anthropic's shape (`anthropic_error`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from proxy.apis.anthropic.messages import ERROR_TYPES
from proxy.demo import provider_answers as answers
from proxy.demo.echo.report import Reply
from proxy.demo.event_stream import send_stream


def anthropic_error(status: int, message: str) -> web.Response:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)


async def messages(request: web.Request, body: Mapping[str, Any], reply: Reply) -> web.StreamResponse:
    message = answers.anthropic_message(reply.model, reply.text, ids=f"echo{reply.suffix}", usage=reply.usage)
    if body.get("stream") is not True:
        return web.json_response({**message, "echo": reply.echo})
    events = answers.anthropic_events(message, pieces=reply.pieces)
    delta = next(data for name, data in events if name == "message_delta")
    delta["echo"] = reply.echo  # with the stop reason and the output tokens
    return await send_stream(request, answers.frames(events))
