"""The echo's answer in Anthropic's Messages shape (`POST /v1/messages`), whole or streamed.

A stream is Anthropic's named events: `message_start`, `content_block_start`, `ping`,
`content_block_delta` (text deltas) per few words, `content_block_stop`, `message_delta` (the
stop reason, the output tokens and the report as `echo`), `message_stop`. Errors on these paths
take Anthropic's shape (`anthropic_error`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from proxy.apis.anthropic.messages import ERROR_TYPES
from proxy.demo.echo.report import pieces
from proxy.demo.echo.sse_writer import Reply, event, open_stream


def anthropic_error(status: int, message: str) -> web.Response:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return web.json_response({"type": "error", "error": {"type": kind, "message": message}}, status=status)


def _message(reply: Reply, content: list[dict[str, Any]], stop: str | None, output_tokens: int) -> dict[str, Any]:
    return {
        "id": f"msg_echo{reply.suffix}",
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": {"input_tokens": reply.prompt_tokens, "output_tokens": output_tokens},
    }


async def messages(request: web.Request, body: Mapping[str, Any], reply: Reply) -> web.StreamResponse:
    if body.get("stream") is not True:
        answer = _message(reply, [{"type": "text", "text": reply.text}], "end_turn", reply.completion_tokens)
        return web.json_response({**answer, "echo": reply.report.to_dict()})
    response = await open_stream(request)

    async def send(kind: str, **fields: Any) -> None:
        await response.write(event({"type": kind, **fields}, kind))

    await send("message_start", message=_message(reply, [], None, 1))
    await send("content_block_start", index=0, content_block={"type": "text", "text": ""})
    await send("ping")
    for piece in pieces(reply.text):
        await send("content_block_delta", index=0, delta={"type": "text_delta", "text": piece})
    await send("content_block_stop", index=0)
    delta = {"stop_reason": "end_turn", "stop_sequence": None}
    await send(
        "message_delta", delta=delta, usage={"output_tokens": reply.completion_tokens}, echo=reply.report.to_dict()
    )
    await send("message_stop")
    await response.write_eof()
    return response
