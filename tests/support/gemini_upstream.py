"""A fake Gemini provider for the suite: a real aiohttp app on 127.0.0.1 that records what it
receives (as the suite's fake does: `tests.support.upstream.Received`) and answers Gemini's paths
at its root as Google does, the Developer API's (`/v1beta/models/{m}:method`) and Vertex AI's native ones
(`/v1beta1/projects/{p}/locations/{l}/publishers/google/models/{m}:method`) alike:

    :generateContent         a GenerateContentResponse
    :streamGenerateContent   the same in pieces: server-sent events with `?alt=sse`, else a JSON array
    :countTokens             {"totalTokens": N}
    interactions             an Interaction (`/v1/interactions`, `/v1beta/interactions`, Vertex AI's
                             `/v1beta1/projects/{p}/locations/{l}/interactions`), or its events with `stream`
    cachedContents, files, models (GET)
                             what Google keeps: a cache is created, read, listed, updated and deleted;
                             files and models are listed
    .../endpoints/openapi/chat/completions   a chat completion (Vertex AI's OpenAI-compatible endpoint)
    anything else            404 in Google's shape

Its count is its own: tiktoken's cl100k_base over every text of the request, and each other part
(a function call, its response, inline data) as its JSON, never the guard's counter; a request
naming a `cachedContent` counts the cache's tokens too, as Google does. With `limit`
set, a request over it is refused with Gemini's own overflow sentence. It can break a stream after
`break_stream_after` pieces, as a dropped connection would. Its answers are built by
`proxy.demo.provider_answers` and streamed by `proxy.demo.event_stream`, shared with every other
fake upstream; what is its own is the recording, its count and the scripted failures.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.demo import interaction_answers
from proxy.demo import provider_answers as answers
from proxy.demo.event_stream import send_stream
from tests.support.cookbook import encoding
from tests.support.upstream import Received

ENCODING = encoding("gpt-4")  # cl100k_base, from the files litellm ships
REPLY = "Hello from Gemini."
_PATH = re.compile(
    r"/[^/]+/(?:(?:projects/[^/]+/locations/[^/]+/)?publishers/google/)?models/(?P<model>[^/:]+):(?P<method>\w+)"
)


def texts(body: dict[str, Any]) -> list[str]:
    """Every text of a generateContent body, and each other part as its JSON."""
    found: list[str] = []
    system = body.get("systemInstruction")
    turns = list(body.get("contents") or [])
    if isinstance(system, dict):
        turns.append(system)
    for turn in turns:
        for part in turn.get("parts") or []:
            if isinstance(part.get("text"), str):
                found.append(part["text"])
            else:
                found.append(json.dumps({k: v for k, v in part.items() if k != "thoughtSignature"}))
    found += [json.dumps(tool) for tool in body.get("tools") or []]
    return found


def interaction_texts(body: dict[str, Any]) -> list[str]:
    """Every text of an Interactions body (its input, whatever its form), each other content or
    step as its JSON."""
    found = [body["system_instruction"]] if isinstance(body.get("system_instruction"), str) else []
    given = body.get("input")
    items = [given] if not isinstance(given, list) else given
    for item in items:
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict) and isinstance(item.get("content"), list):
            found += [c["text"] if c.get("type") == "text" else json.dumps(c) for c in item["content"]]
        elif isinstance(item, dict) and item.get("type") == "text":
            found.append(item["text"])
        else:
            found.append(json.dumps(item))
    return found + [json.dumps(tool) for tool in body.get("tools") or []]


def independent_count(body: dict[str, Any]) -> int:
    """The fake's count of a generateContent body (no code shared with the guard)."""
    return sum(len(ENCODING.encode(text, disallowed_special=())) for text in texts(body))


@dataclass
class FakeGemini:
    received: list[Received] = field(default_factory=list)
    limit: int | None = None  # refuse a prompt over this many tokens (its own count), as Gemini words it
    break_stream_after: int | None = None  # close the connection after this many stream pieces
    call_tool: str | None = None  # answer with a call of this function (with a thought signature)
    caches: dict[str, dict[str, Any]] = field(default_factory=dict)  # what cachedContents holds, by name

    def cache(self, body: dict[str, Any]) -> dict[str, Any]:
        """Keep `body` (a CachedContent to create) and answer as Google does, with its size."""
        name = f"cachedContents/c{len(self.caches)}"
        usage = {"totalTokenCount": independent_count(body)}
        expires = "2099-01-01T00:00:00.123456789Z"
        self.caches[name] = {"name": name, "model": body.get("model"), "usageMetadata": usage, "expireTime": expires}
        return self.caches[name]

    def cached_tokens(self, name: str) -> int:
        """The tokens a cache holds (its `usageMetadata.totalTokenCount`), 0 for no such cache."""
        return int(self.caches.get(name, {}).get("usageMetadata", {}).get("totalTokenCount", 0))

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.answer)
        return app

    @property
    def generated(self) -> list[Received]:
        """What reached it on the generate paths (not the count endpoint)."""
        return [r for r in self.received if "Generate" in r.path or ":generate" in r.path]

    async def answer(self, request: web.Request) -> web.StreamResponse:
        received = await Received.of(request)
        self.received.append(received)
        if request.path.endswith("/endpoints/openapi/chat/completions"):  # Vertex AI's OpenAI-compatible endpoint
            return web.json_response(answers.chat_completion("m", REPLY, ids="c", created=0))
        if request.path.endswith("/interactions") and request.method == "POST":
            return await self._interaction(request, received.json())
        kept = await self._kept(request, received)
        if kept is not None:
            return kept
        match = _PATH.fullmatch(request.path)
        if match is None or request.method != "POST":
            return _error(404, f"no such path {request.path}", "NOT_FOUND")
        body = received.json()
        if match["method"] == "countTokens":
            inner = body.get("generateContentRequest", body)
            return web.json_response({"totalTokens": independent_count(inner)})
        held = self.cached_tokens(str(body.get("cachedContent")))
        prompt = independent_count(body) + held
        if self.limit is not None and prompt > self.limit:
            message = f"The input token count ({prompt}) exceeds the maximum number of tokens allowed ({self.limit})."
            return _error(400, message, "INVALID_ARGUMENT")
        usage = answers.Usage(input=prompt, output=3)  # Google's promptTokenCount holds the cache's tokens
        pieces = [answers.gemini_response(match["model"], text, usage=usage) for text in ("Hello ", "from ", "Gemini.")]
        if self.call_tool is not None:
            call = {"functionCall": {"name": self.call_tool, "args": {"q": "Paris"}}, "thoughtSignature": "c2lnbmVk"}
            pieces = [answers.gemini_response(match["model"], [call], usage=usage)]
        if match["method"] == "generateContent":
            whole = answers.gemini_response(match["model"], REPLY, usage=usage) if self.call_tool is None else pieces[0]
            return web.json_response(whole)
        sse = request.query.get("alt") == "sse"
        headers = {"Content-Type": "text/event-stream" if sse else "application/json"}
        frames = answers.gemini_frames(pieces, sse)
        return await send_stream(request, frames, break_after=self.break_stream_after, headers=headers)


    async def _interaction(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        prompt = sum(len(ENCODING.encode(text, disallowed_special=())) for text in interaction_texts(body))
        if self.limit is not None and prompt > self.limit:
            message = f"The input token count ({prompt}) exceeds the maximum number of tokens allowed ({self.limit})."
            return web.json_response({"error": {"code": "invalid_request", "message": message}}, status=400)
        whole = interaction_answers.interaction(body.get("model"), REPLY, counts=answers.Usage(prompt, 3))
        if body.get("stream") is not True:
            return web.json_response(whole)
        frames = interaction_answers.interaction_frames(whole, ["Hello ", "from ", "Gemini."])
        return await send_stream(request, frames, break_after=self.break_stream_after)

    async def _kept(self, request: web.Request, received: Received) -> web.Response | None:
        """cachedContents, files and models, as Google keeps them; None for any other path."""
        tail = request.path.split("/cachedContents", 1)
        if len(tail) == 2:
            name = "cachedContents" + tail[1]
            if request.method == "POST" and not tail[1]:
                return web.json_response(self.cache(received.json()))
            if not tail[1]:
                return web.json_response({"cachedContents": list(self.caches.values())})
            if name not in self.caches:
                return _error(404, f"{name} not found", "NOT_FOUND")
            if request.method == "DELETE":
                del self.caches[name]
                return web.json_response({})
            if request.method == "PATCH":
                self.caches[name] = {**self.caches[name], **received.json()}
            return web.json_response(self.caches[name])
        if request.method == "GET" and request.path.rstrip("/").endswith("/files"):
            return web.json_response({"files": []})
        if request.method == "GET" and request.path.rstrip("/").endswith("/models"):
            return web.json_response({"models": [{"name": "models/gemini-2.5-flash"}]})
        if request.method == "GET" and "/models/" in request.path and ":" not in request.path:
            return web.json_response({"name": "models/" + request.path.rpartition("/")[2]})
        return None


def _error(status: int, message: str, code: str) -> web.Response:
    return web.json_response({"error": {"code": status, "message": message, "status": code}}, status=status)
