"""The echo's answer in Gemini's shape (`:generateContent`, `:streamGenerateContent`,
`:countTokens`, on the Developer API's paths and Vertex AI's native ones alike).

A whole answer is one `GenerateContentResponse`; a stream is the same answer in pieces, as
server-sent events with `?alt=sse` (what google-genai asks for) and as one JSON array without it
(Gemini's own default). Each piece carries the usage so far; the last one the report as `echo`.
Errors on these paths take Google's shape (`proxy.apis.gemini.generate_content.gemini_error`).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from proxy.apis.gemini.generate_content import count_tokens_answer, gemini_error
from proxy.demo.echo.report import pieces
from proxy.demo.echo.sse_writer import Reply, event, open_stream


def google_error(status: int, message: str) -> web.Response:
    return web.json_response(gemini_error(status, message), status=status)


def _answer(reply: Reply, text: str, output_tokens: int, finished: bool) -> dict[str, Any]:
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": [{"text": text}]}, "index": 0}
    if finished:
        candidate["finishReason"] = "STOP"
    usage = {
        "promptTokenCount": reply.prompt_tokens,
        "candidatesTokenCount": output_tokens,
        "totalTokenCount": reply.prompt_tokens + output_tokens,
    }
    answer = {"candidates": [candidate], "usageMetadata": usage, "modelVersion": reply.model}
    return {**answer, "responseId": f"echo{reply.suffix}"}


async def generate_content(request: web.Request, method: str, reply: Reply) -> web.StreamResponse:
    """The answer `method` (the path's `:method`) asks for."""
    if method == "countTokens":
        return web.json_response(count_tokens_answer(reply.prompt_tokens))
    if method == "generateContent":
        return web.json_response({**_answer(reply, reply.text, reply.completion_tokens, True),
                                  "echo": reply.report.to_dict()})  # fmt: skip
    texts = list(pieces(reply.text)) or [""]
    chunks = [_answer(reply, text, 1, False) for text in texts[:-1]]
    chunks.append({**_answer(reply, texts[-1], reply.completion_tokens, True), "echo": reply.report.to_dict()})
    if request.query.get("alt") == "sse":
        response = await open_stream(request)
        for chunk in chunks:
            await response.write(event(chunk))
    else:  # Gemini's JSON-array stream: `[` then the pieces, comma-separated, then `]`
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for k, chunk in enumerate(chunks):
            await response.write((b"[" if k == 0 else b",\r\n") + json.dumps(chunk).encode())
        await response.write(b"]")
    await response.write_eof()
    return response
