"""The echo's answer in the Responses API's shape (`POST /v1/responses`), whole or streamed.

A stream is the event sequence OpenAI sends for one text output: `response.created`,
`response.in_progress`, `response.output_item.added`, `response.content_part.added`,
`response.output_text.delta` per few words, `response.output_text.done`,
`response.content_part.done`, `response.output_item.done`, `response.completed` (which carries
the whole response, with its usage and the report as `echo`). Every event has its
`sequence_number`. `previous_response_id` is accepted and echoed; the echo keeps no state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from proxy.demo.echo.report import pieces
from proxy.demo.echo.sse_writer import Reply, event, open_stream


def _response(body: Mapping[str, Any], reply: Reply, status: str, output: list[dict[str, Any]]) -> dict[str, Any]:
    done = status == "completed"
    return {
        "id": f"resp_echo{reply.suffix}",
        "object": "response",
        "created_at": reply.created,
        "status": status,
        "model": reply.model,
        "output": output,
        "error": None,
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "temperature": body.get("temperature", 1.0),
        "top_p": body.get("top_p", 1.0),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "text": body.get("text") or {"format": {"type": "text"}},
        "usage": _usage(reply) if done else None,
        **({"echo": reply.report.to_dict()} if done else {}),
    }


def _usage(reply: Reply) -> dict[str, Any]:
    return {
        "input_tokens": reply.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": reply.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": reply.prompt_tokens + reply.completion_tokens,
    }


def _message(reply: Reply, text: str, status: str) -> dict[str, Any]:
    content = [_part(text)] if status == "completed" else []
    return {
        "id": f"msg_echo{reply.suffix}",
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


async def responses(request: web.Request, body: Mapping[str, Any], reply: Reply) -> web.StreamResponse:
    item = _message(reply, reply.text, "completed")
    if body.get("stream") is not True:
        return web.json_response(_response(body, reply, "completed", [item]))
    response = await open_stream(request)
    sequence = 0

    async def send(kind: str, **fields: Any) -> None:
        nonlocal sequence
        await response.write(event({"type": kind, "sequence_number": sequence, **fields}, kind))
        sequence += 1

    where = {"item_id": item["id"], "output_index": 0}
    await send("response.created", response=_response(body, reply, "in_progress", []))
    await send("response.in_progress", response=_response(body, reply, "in_progress", []))
    await send("response.output_item.added", output_index=0, item=_message(reply, "", "in_progress"))
    await send("response.content_part.added", **where, content_index=0, part=_part(""))
    for piece in pieces(reply.text):
        await send("response.output_text.delta", **where, content_index=0, delta=piece, logprobs=[])
    await send("response.output_text.done", **where, content_index=0, text=reply.text, logprobs=[])
    await send("response.content_part.done", **where, content_index=0, part=_part(reply.text))
    await send("response.output_item.done", output_index=0, item=item)
    await send("response.completed", response=_response(body, reply, "completed", [item]))
    await response.write_eof()
    return response
