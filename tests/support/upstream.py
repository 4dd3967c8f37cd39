"""The suite's one fake upstream: a real aiohttp app on 127.0.0.1 that records what it receives
(method, path, query as sent, headers, body bytes) and answers every API shape the guard serves as
the provider would, in JSON or as a server-sent event stream when the body asks for `stream`:

    POST /v1/chat/completions, /openai/deployments/{d}/chat/completions   chat completion
    POST /v1/responses                                                    Response (message or function_call),
                                                                          stored: `tests.support.stored_responses`
    POST /v1/responses/input_tokens, /v1/conversations                    its count; a new conversation
    POST /v1/completions, /openai/deployments/{d}/completions             text completion
    POST /v1/messages                                                     Anthropic message (text or tool_use)
    POST /v1/messages/count_tokens                                        {"input_tokens": ...}
    anything else                                                         echoed back

Only `/v1/chat/completions` is answered unless `every_shape` is set: the gateway's tests see what the
guard forwards on every other path echoed back unchanged, the SDK tests a provider's answers.

When a Responses or Anthropic request offers tools and is not already answering a call, the reply
is a call of the first tool, so an SDK test can run a whole tool loop. The answers themselves are
built by `proxy.demo.provider_answers` and streamed by `proxy.demo.event_stream`, shared with the
echo upstream, the client-compatibility suite's upstream and the benchmark's; what is this fake's
own is the recording, the scripted failures and its independent count.

It checks that what the guard forwards fits with a count of its own: OpenAI's cookbook rule with
tiktoken directly (`tests.support.cookbook.cookbook_count`), never the guard's counter, times
`provider_factor` (a provider counting higher than the guard). With `limit` set, a chat or
Anthropic prompt over it is refused in the provider's words (chat: OpenAI, vLLM, Vertex AI or
llama.cpp, per `error_style`). It can be told to misbehave too: stall, break a stream half-way,
answer every chat request with one error, or echo a body field in an error as upstreams do.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import math
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.demo import provider_answers as answers
from proxy.demo.event_stream import SSE_HEADERS, send_stream
from tests.support.cookbook import cookbook_count
from tests.support.stored_responses import StoredResponses, output_tokens

TOOL_ARGUMENTS = '{"q": "weather"}'  # what a tool call asks, whatever the tool


@dataclass
class Received:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    raw_query: str = ""  # as it came on the wire, still percent-encoded

    def json(self) -> Any:
        return json.loads(self.body)

    @classmethod
    async def of(cls, request: web.Request) -> Received:
        """What `request` carried, its body read whole (every fake of the suite records this)."""
        return cls(
            request.method,
            request.path,
            request.query_string,
            dict(request.headers),
            await request.read(),
            request.rel_url.raw_query_string,
        )


def overflow_error(style: str, limit: int, prompt: int) -> tuple[int, dict[str, Any]]:
    if style == "openai":
        message = (
            f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
            f"{prompt} tokens. Please reduce the length of the messages."
        )
        return 400, {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    if style == "vllm":
        message = (
            f"This model's maximum context length is {limit} tokens. However, you requested {prompt + 100} "
            f"tokens ({prompt} in the messages, 100 in the completion). Please reduce the length of the messages or completion."
        )
        return 400, {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    if style == "vertex":
        message = f"The input token count ({prompt}) exceeds the maximum number of tokens allowed ({limit})."
        return 400, [{"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}]  # type: ignore[return-value]
    if style == "llamacpp":
        return 400, {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt,
                "n_ctx": limit,
            }
        }
    raise ValueError(style)


@dataclass
class FakeUpstream:
    received: list[Received] = field(default_factory=list)
    reply_text: str = "Hello from upstream."
    delay: float = 0.0  # before answering
    hold: asyncio.Event | None = None  # when given, chat answers wait until it is set
    arrived: asyncio.Event = field(default_factory=asyncio.Event)  # set once a request is received
    chunk_delay: float = 0.0  # between stream chunks
    stream_chunks: int = 5
    break_stream_after: int | None = None  # close the connection after this many chunks
    # Reject prompts whose count (ours x provider_factor) exceeds `limit`, in this provider's words.
    limit: int | None = None
    provider_factor: float = 1.25
    error_style: str = "openai"
    renders_field: str | None = None  # count the texts of this body field too, as a server's own extension might
    fail_with: tuple[int, dict[str, Any]] | None = None  # answer every chat request with this error
    echo_field: str | None = None  # answer 400 starting with this body field's value, as upstreams echo input
    gzip_errors: bool = False  # compress error bodies when the client accepts gzip, as OpenAI does
    stream_cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    stream_started: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""  # its base URL, set by the fixture that starts it
    every_shape: bool = False  # answer every shape below, not only /v1/chat/completions (the rest echoed)
    stored: StoredResponses = field(default_factory=StoredResponses)  # what the Responses API keeps
    # Apply a Messages body's `clear_tool_uses_20250919` edit before the `limit` check, and report
    # it in `context_management.applied_edits`, as Anthropic's API does (`_context_edits`).
    edits_context: bool = False

    async def served(self, aiohttp_server: Any) -> FakeUpstream:
        """This upstream served by pytest-aiohttp's `aiohttp_server` (which cancels the handlers of
        clients that leave), its `url` the server's `/v1`."""
        server = await aiohttp_server(self.app())
        self.url = str(server.make_url("/v1"))
        return self

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        if self.every_shape:
            app.router.add_post("/openai/deployments/{deployment}/chat/completions", self.chat)
            app.router.add_post("/v1/responses", self.responses)
            app.router.add_post("/v1/responses/input_tokens", self.input_tokens)
            app.router.add_post("/v1/conversations", self.conversations)
            app.router.add_post("/v1/completions", self.completions)
            app.router.add_post("/openai/deployments/{deployment}/completions", self.completions)
            app.router.add_post("/v1/messages", self.messages)
            app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        app.router.add_route("*", "/{tail:.*}", self.echo)
        return app

    def last(self, path_end: str) -> Received:
        """The last request received on a path ending with `path_end`."""
        return next(r for r in reversed(self.received) if r.path.endswith(path_end))

    async def _record(self, request: web.Request) -> Received:
        received = await Received.of(request)
        self.received.append(received)
        self.arrived.set()
        return received

    def provider_count(self, body: dict[str, Any]) -> int:
        """The provider's count of `body`: the cookbook's rule with tiktoken directly, over its
        messages, tools, Anthropic's top-level `system` and the `renders_field` texts, times
        `provider_factor`. It shares no code with the guard's counter, so a guard that counts wrong
        is caught: a forwarded body the guard under-counts is refused here."""
        extra = [str(d.get("text", "")) for d in body.get(self.renders_field, ())] if self.renders_field else []
        system = body.get("system")
        if isinstance(system, str):
            extra.append(system)
        elif isinstance(system, list):
            extra += [str(block.get("text", "")) for block in system if isinstance(block, dict)]
        return math.ceil(cookbook_count(body, extra) * self.provider_factor)

    # -- OpenAI chat completions and legacy completions ---------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        received = await self._record(request)
        body = received.json()
        model = body.get("model") or request.match_info.get("deployment")
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.hold is not None:
            await self.hold.wait()
        if self.fail_with is not None:
            return web.json_response(self.fail_with[1], status=self.fail_with[0], headers={"retry-after": "7"})
        if self.echo_field is not None:
            message = f"{body.get(self.echo_field)} is not a valid value for '{self.echo_field}'."
            error = {"message": message, "type": "invalid_request_error", "param": self.echo_field, "code": None}
            return web.json_response({"error": error}, status=400)
        if self.limit is not None:
            prompt = self.provider_count(body)
            if prompt > self.limit:
                status, error = overflow_error(self.error_style, self.limit, prompt)
                if self.gzip_errors and "gzip" in request.headers.get("Accept-Encoding", ""):
                    body = gzip.compress(json.dumps(error).encode())
                    return web.Response(
                        body=body,
                        status=status,
                        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
                    )
                return web.json_response(error, status=status)
        if body.get("stream"):
            return await self._stream(request, body)
        return web.json_response(answers.chat_completion(model, self.reply_text), headers={"x-upstream": "fake"})

    async def _stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        pieces = [f"part{i} " for i in range(self.stream_chunks)]
        options = body.get("stream_options")
        asked = isinstance(options, dict) and options.get("include_usage") is True  # the usage chunk, last
        usage = answers.Usage(self.provider_count(body), self.stream_chunks) if asked else None
        chunks = answers.chat_chunks(body.get("model"), "".join(pieces), pieces=pieces, usage=usage)
        try:
            return await send_stream(
                request,
                answers.frames(chunks, done=True),
                break_after=self.break_stream_after,
                pause=self.chunk_delay,
                started=self.stream_started,
                headers={**SSE_HEADERS, "x-upstream": "fake"},
            )
        except (asyncio.CancelledError, ConnectionResetError):
            self.stream_cancelled.set()
            raise

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = (await self._record(request)).json()
        completion = answers.text_completion(
            body.get("model") or request.match_info.get("deployment"), " " + self.reply_text
        )
        if body.get("stream"):
            return await send_stream(request, answers.frames([(None, completion)], done=True))
        return web.json_response(completion)

    # -- OpenAI Responses ---------------------------------------------------------------------

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = (await self._record(request)).json()
        owner = request.headers.get("Authorization", "")
        prompt, refused = self.stored.prompt(body, owner)
        if refused is not None:
            return refused
        items = body.get("input") if isinstance(body.get("input"), list) else []
        answering = bool(items) and isinstance(items[-1], dict) and items[-1].get("type") == "function_call_output"
        tools = [t for t in body.get("tools") or () if t.get("type") == "function"]
        answer = answers.ToolCall(tools[0]["name"], TOOL_ARGUMENTS) if tools and not answering else self.reply_text
        item, model = answers.response_item(answer), body.get("model")
        output = output_tokens(self.reply_text if isinstance(answer, str) else TOOL_ARGUMENTS)
        ids = str(len(self.stored.responses) + 1)
        conversation = self.stored.keep(f"resp_{ids}", body, owner, prompt + output)
        self.stored.counted.append(prompt)
        fields: dict[str, Any] = {"tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", [])}
        fields |= {"ids": ids, "usage": answers.Usage(prompt, output)}
        if conversation is not None:
            fields["conversation"] = {"id": conversation}
        if not body.get("stream"):
            return web.json_response(answers.response(model, [item], **fields))
        return await send_stream(request, answers.frames(answers.response_events(model, item, **fields)))

    async def input_tokens(self, request: web.Request) -> web.StreamResponse:
        body = (await self._record(request)).json()
        held, missing = self.stored.held(body, request.headers.get("Authorization", ""))
        if missing is not None:
            return missing
        counted = held + self.stored.sent_tokens(body)
        return web.json_response({"object": "response.input_tokens", "input_tokens": counted})

    async def conversations(self, request: web.Request) -> web.StreamResponse:
        await self._record(request)
        return web.json_response(self.stored.create_conversation(request.headers.get("Authorization", "")))

    # -- Anthropic Messages -------------------------------------------------------------------

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = (await self._record(request)).json()
        applied = self._context_edits(body) if self.edits_context and "context_management" in body else None
        if applied is not None:
            body, edits = applied
        if self.limit is not None and (tokens := self.provider_count(body)) > self.limit:
            error = {
                "type": "invalid_request_error",
                "message": f"prompt is too long: {tokens} tokens > {self.limit} maximum",
            }
            return web.json_response({"type": "error", "error": error}, status=400)
        if self.limit is not None and tokens + body.get("max_tokens", 0) > self.limit:  # Anthropic's other check
            message = (
                f"input length and `max_tokens` exceed context limit: {tokens} + {body['max_tokens']} > "
                f"{self.limit}, decrease input length or `max_tokens` and try again"
            )
            error = {"type": "invalid_request_error", "message": message}
            return web.json_response({"type": "error", "error": error}, status=400)
        last = body["messages"][-1]
        answering = isinstance(last.get("content"), list) and any(
            b.get("type") == "tool_result" for b in last["content"]
        )
        tools = body.get("tools") or []
        answer = answers.ToolCall(tools[0]["name"], TOOL_ARGUMENTS) if tools and not answering else self.reply_text
        message = answers.anthropic_message(body.get("model"), answer)
        managed = {"context_management": {"applied_edits": edits}} if applied is not None else {}
        if not body.get("stream"):
            return web.json_response({**message, **managed})
        events = [(n, {**d, **managed} if n == "message_delta" else d) for n, d in answers.anthropic_events(message)]
        return await send_stream(request, answers.frames(events))

    def _context_edits(self, body: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """`body` once its `clear_tool_uses_20250919` edit ran as Anthropic documents it (over the
        trigger, every tool result but the newest `keep` replaced by a placeholder), and the edits
        applied. Written here apart from the guard's own, with only the trigger and keep read."""
        edits: list[dict[str, Any]] = []
        for edit in body["context_management"].get("edits") or ():
            if edit.get("type") != "clear_tool_uses_20250919":
                continue
            trigger = (edit.get("trigger") or {}).get("value", 100_000)
            keep = (edit.get("keep") or {}).get("value", 3)
            before = self.provider_count(body)
            if before <= trigger:
                continue
            places = [
                (i, j)
                for i, message in enumerate(body["messages"])
                if isinstance(message["content"], list)
                for j, block in enumerate(message["content"])
                if block.get("type") == "tool_result"
            ]
            cleared = places[: max(0, len(places) - keep)]
            messages = [dict(m) for m in body["messages"]]
            for i, j in cleared:
                messages[i]["content"] = [
                    {**b, "content": "[cleared]"} if k == j else b for k, b in enumerate(messages[i]["content"])
                ]
            body = {**body, "messages": messages}
            tokens = before - self.provider_count(body)
            edits.append({"type": edit["type"], "cleared_tool_uses": len(cleared), "cleared_input_tokens": tokens})
        return body, edits

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        received = await self._record(request)
        return web.json_response({"input_tokens": self.provider_count(received.json())})

    # -- Any other path -----------------------------------------------------------------------

    async def echo(self, request: web.Request) -> web.StreamResponse:
        received = await self._record(request)
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(
            body=received.body or b"{}",
            content_type=request.content_type if received.body else "application/json",
            headers={"x-echo-path": request.path, "x-echo-query": request.query_string},
        )
