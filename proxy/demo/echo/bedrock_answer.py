"""The echo's answers as bedrock-runtime gives them (`/model/{modelId}/...`): Converse whole and as
its event stream (`messageStart`, `contentBlockDelta` per few words, `contentBlockStop`,
`messageStop`, `metadata` with the usage and the report as `echo`), and InvokeModel for Claude: an
Anthropic Messages answer whole, or its events as `chunk` frames (`{"bytes": base64(event)}`).
Errors on these paths take Bedrock's shape (`bedrock_error`)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from proxy.apis.bedrock.aws_event_stream import encode_message
from proxy.apis.bedrock.converse import ERROR_NAMESPACE, exception_name
from proxy.demo import provider_answers as answers
from proxy.demo.echo.report import Reply
from proxy.demo.event_stream import send_stream

EVENT_STREAM = {"Content-Type": "application/vnd.amazon.eventstream"}


def bedrock_error(status: int, message: str) -> web.Response:
    headers = {"x-amzn-ErrorType": f"{exception_name(status)}:{ERROR_NAMESPACE}"}
    return web.json_response({"message": message}, status=status, headers=headers)


async def bedrock(request: web.Request, operation: str, body: Mapping[str, Any], reply: Reply) -> web.StreamResponse:
    if operation.startswith("converse"):
        return await _converse(request, operation == "converse-stream", reply)
    message = answers.anthropic_message(reply.model, reply.text, ids=f"echo{reply.suffix}", usage=reply.usage)
    if operation == "invoke":
        return web.json_response({**message, "echo": reply.echo})
    events = answers.anthropic_events(message, pieces=reply.pieces)
    delta = next(data for name, data in events if name == "message_delta")
    delta["echo"] = reply.echo
    chunks = [_frame("chunk", {"bytes": base64.b64encode(json.dumps(data).encode()).decode()}) for _, data in events]
    return await send_stream(request, chunks, headers=EVENT_STREAM)


async def _converse(request: web.Request, stream: bool, reply: Reply) -> web.StreamResponse:
    usage = {"inputTokens": reply.prompt_tokens, "outputTokens": reply.completion_tokens,
             "totalTokens": reply.prompt_tokens + reply.completion_tokens}  # fmt: skip
    if not stream:
        message = {"role": "assistant", "content": [{"text": reply.text}]}
        answer = {"output": {"message": message}, "stopReason": "end_turn", "usage": usage, "metrics": {"latencyMs": 0}}
        return web.json_response({**answer, "echo": reply.echo})
    deltas = [("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": piece}}) for piece in reply.pieces]
    events: list[tuple[str, Mapping[str, Any]]] = [
        ("messageStart", {"role": "assistant"}),
        *deltas,
        ("contentBlockStop", {"contentBlockIndex": 0}),
        ("messageStop", {"stopReason": "end_turn"}),
        ("metadata", {"usage": usage, "metrics": {"latencyMs": 0}, "echo": reply.echo}),
    ]
    return await send_stream(request, [_frame(name, data) for name, data in events], headers=EVENT_STREAM)


def _frame(event: str, payload: Mapping[str, Any]) -> bytes:
    headers = {":event-type": event, ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, json.dumps(payload).encode())
