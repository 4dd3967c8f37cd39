"""A recording upstream for the client-compatibility suite: it keeps what reached it and answers in
each API's shape (chat, Responses, legacy completions, embeddings, Anthropic Messages, Gemini, Google's
Interactions), whole or
streamed word by word with every event a strict client expects, with text or with a scripted tool
call, and can break a stream part-way. The answers are built by `proxy.demo.provider_answers` and
streamed by `proxy.demo.event_stream`, shared with the suite's fake upstream and the echo; what is
this upstream's own is the recording, the script and the routing of paths.

It counts nothing with the guard's code: fit is checked by the tests with tiktoken directly.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.demo import interaction_answers
from proxy.demo import provider_answers as answers
from proxy.demo.event_stream import send_stream
from proxy.demo.provider_answers import Answer, ToolCall

USAGE = answers.Usage(input=10, output=2)
GEMINI_MODEL = "gemini-2.5-flash"  # the modelVersion of every Gemini answer


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class RecordingUpstream:
    received: list[Received] = field(default_factory=list)
    # Answers to give, in order (a ToolCall or a text); when empty, "ok" (or the call a forced
    # tool_choice names, with `forced_arguments`).
    script: list[Answer] = field(default_factory=list)
    forced_arguments: str = "{}"
    break_after: int | None = None  # close the connection after this many stream events

    def reset(self) -> None:
        self.received.clear()
        self.script.clear()
        self.forced_arguments, self.break_after = "{}", None

    @property
    def last(self) -> Received:
        return self.received[-1]

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else {}
        self.received.append(Received(request.path, dict(request.headers), body))
        path = request.path.rstrip("/")
        answer = self._answer(body)
        model, stream = body.get("model"), bool(body.get("stream"))
        # Every id of the answer ends in the request's number, so the ids of a conversation differ.
        common: dict[str, Any] = {"ids": f"rec{len(self.received)}", "created": int(time.time())}
        if path.endswith("/embeddings"):
            as_base64 = body.get("encoding_format") == "base64"
            inputs = answers.embedding_inputs(body.get("input")) or []
            vectors = [[0.1, 0.2, 0.3]] * len(inputs)  # one three-number embedding per input
            return web.json_response(answers.embeddings(model, vectors, tokens=len(inputs), as_base64=as_base64))
        if path.endswith("/chat/completions"):
            if not stream:
                return web.json_response(answers.chat_completion(model, answer, usage=USAGE, logprobs=True, **common))
            chunks = answers.chat_chunks(model, answer, pieces=_words(answer), framed=True, logprobs=True, **common)
            return await self._stream(request, answers.frames(chunks, done=True))
        if path.endswith("/responses"):
            item = answers.response_item(answer, ids=common["ids"])
            fields = {**common, "usage": USAGE, "every_field": True}
            fields["previous_response_id"] = body.get("previous_response_id")
            if not stream:
                return web.json_response(answers.response(model, [item], **fields))
            events = answers.response_events(model, item, pieces=_words(answer), part_events=True, **fields)
            return await self._stream(request, answers.frames(events))
        if path.endswith("/completions"):
            text = answer if isinstance(answer, str) else answer.arguments
            if not stream:
                return web.json_response(answers.text_completion(model, text, usage=USAGE, **common))
            chunks = answers.text_completion_chunks(model, answers.words(text), **common)
            return await self._stream(request, answers.frames(chunks, done=True))
        if path.endswith("/interactions"):  # Google's Interactions API, at the host's root
            text = answer if isinstance(answer, str) else answer.arguments
            whole = interaction_answers.interaction(model, text, counts=USAGE, ids=common["ids"])
            if not stream:
                return web.json_response(whole)
            return await self._stream(request, interaction_answers.interaction_frames(whole, answers.words(text)))
        if ":generateContent" in path or ":streamGenerateContent" in path:  # Gemini's, at the host's root
            text = answer if isinstance(answer, str) else answer.arguments
            if ":generateContent" in path:
                return web.json_response(answers.gemini_response(GEMINI_MODEL, text, usage=USAGE))
            *before, last = answers.words(text)
            pieces = [answers.gemini_response(GEMINI_MODEL, word, usage=USAGE, finished=False) for word in before]
            pieces.append(answers.gemini_response(GEMINI_MODEL, last, usage=USAGE))
            return await self._stream(request, answers.gemini_frames(pieces, sse=True))
        if path.endswith("/messages"):
            message = answers.anthropic_message(model, answer, ids=common["ids"], usage=USAGE)
            if not stream:
                return web.json_response(message)
            return await self._stream(request, answers.frames(answers.anthropic_events(message, pieces=_words(answer))))
        return web.json_response({"error": {"message": f"no {path}", "type": "invalid_request_error"}}, status=404)

    def _answer(self, body: dict[str, Any]) -> Answer:
        if self.script:
            return self.script.pop(0)
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            name = choice.get("name") or (choice.get("function") or {}).get("name")
            if name:
                return ToolCall(name, self.forced_arguments)
        return "ok"

    async def _stream(self, request: web.Request, chunks: list[bytes]) -> web.StreamResponse:
        return await send_stream(request, chunks, break_after=self.break_after)


def _words(answer: Answer) -> list[str] | None:
    """A text answer streamed word by word, as providers do (a tool call streams whole)."""
    return answers.words(answer) if isinstance(answer, str) else None
