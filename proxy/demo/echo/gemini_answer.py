"""The echo's answer in Gemini's shape (`:generateContent`, `:streamGenerateContent`,
`:countTokens`, on the Developer API's paths and Vertex AI's native ones alike) and in the
Interactions API's (`interactions`: an `Interaction`, or its events when the body asks `stream`).

A whole answer is one `GenerateContentResponse`; a stream is the same answer in pieces, as
server-sent events with `?alt=sse` (what google-genai asks for) and as one JSON array without it
(Gemini's own default), built by `proxy.demo.provider_answers` as every fake upstream builds them.
Each piece carries the usage so far; the last one the report as `echo`.
Errors on these paths take Google's shape (`proxy.apis.gemini.generate_content.gemini_error`).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from proxy.apis.gemini.generate_content import count_tokens_answer, gemini_error
from proxy.apis.gemini.interactions import interactions_error
from proxy.demo import interaction_answers
from proxy.demo import provider_answers as answers
from proxy.demo.echo.report import Reply
from proxy.demo.event_stream import SSE_HEADERS, send_stream


def google_error(status: int, message: str) -> web.Response:
    return web.json_response(gemini_error(status, message), status=status)


def interactions_failure(status: int, message: str) -> web.Response:
    return web.json_response(interactions_error(status, message), status=status)


async def interaction(request: web.Request, body: dict[str, Any], reply: Reply) -> web.StreamResponse:
    """An interaction's answer: whole, or as its events when the body asks `stream`."""
    whole = interaction_answers.interaction(reply.model, reply.text, counts=reply.usage, ids=f"echo{reply.suffix}")
    whole["echo"] = reply.echo
    if body.get("stream") is not True:
        return web.json_response(whole)
    return await send_stream(request, interaction_answers.interaction_frames(whole, reply.pieces), headers=SSE_HEADERS)


async def generate_content(request: web.Request, method: str, reply: Reply) -> web.StreamResponse:
    """The answer `method` (the path's `:method`) asks for."""
    if method == "countTokens":
        return web.json_response(count_tokens_answer(reply.prompt_tokens))
    ids = f"echo{reply.suffix}"
    if method == "generateContent":
        answer = answers.gemini_response(reply.model, reply.text, usage=reply.usage, ids=ids)
        return web.json_response({**answer, "echo": reply.echo})
    texts = reply.pieces  # never empty: an empty text is one empty piece
    so_far = answers.Usage(input=reply.prompt_tokens, output=1)  # each piece carries the usage so far
    chunks = [answers.gemini_response(reply.model, text, usage=so_far, finished=False, ids=ids) for text in texts[:-1]]
    last = answers.gemini_response(reply.model, texts[-1], usage=reply.usage, ids=ids)
    chunks.append({**last, "echo": reply.echo})
    sse = request.query.get("alt") == "sse"
    headers = SSE_HEADERS if sse else {"Content-Type": "application/json"}
    return await send_stream(request, answers.gemini_frames(chunks, sse), headers=headers)
