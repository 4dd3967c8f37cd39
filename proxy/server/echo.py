"""A built-in OpenAI-compatible upstream that answers every chat request with what reached it.

A testing aid, never a default. It calls no model: `context-guard demo` and
`context-guard serve --upstream echo` put it behind the guard so that anyone can see, with no key
and no network, what the guard forwarded. For each chat completion it reports the number of
messages and their roles, its own count of the prompt (the project's chat-format accounting, with
the model family's tokenizer loaded from local files, exactly as an upstream's `usage` would
report it), every tool call with whether its result arrived, and whether the conversation is
valid for a chat API (no tool result without its call, no call without its results).

The report is the reply's text, for a person reading a chat client, and the response's extra
`echo` field, for a program (the SDKs keep unknown fields). Streaming requests get the same text
as SSE chunks, the `echo` field on the last one, a `usage` chunk when
`stream_options.include_usage` is set, and `data: [DONE]`. `GET /v1/models` lists the ids in
`EchoSettings.models`; any model name is answered. Every error is OpenAI-shaped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from proxy.core.models import ModelRegistry
from proxy.core.tokens import RequestCounter
from proxy.core.turns import call_ids, validity_problems
from proxy.encodings import Tokenizers
from proxy.errors import GuardError
from proxy.server.handlers import parse_chat
from proxy.settings import Settings
from proxy.upstream_settings import Route, UpstreamSettings

OWNER = "context-guard-echo"
UPSTREAM_NAME = "echo"  # how the guard's log lines and metrics name it
START_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True)
class EchoSettings:
    """What the echo upstream can be told: the model ids it lists, and the largest body it reads."""

    models: tuple[str, ...] = ("echo",)  # listed by GET /v1/models; any name is answered
    max_body_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if not self.models or not all(isinstance(m, str) and m.strip() for m in self.models):
            raise ValueError(f"echo models must be a non-empty list of model ids, not {self.models!r}")
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1024:
            raise ValueError(
                f"echo max_body_bytes must be a whole number of at least 1024, not {self.max_body_bytes!r}"
            )


@dataclass(frozen=True)
class ToolCallSeen:
    id: str
    name: str
    answered: bool  # a `tool` message with this call's id reached the echo
    result_tokens: int  # the content tokens of that result (0 when unanswered)


@dataclass(frozen=True)
class EchoReport:
    """What reached the echo upstream in one chat request."""

    model: str
    messages: int
    roles: tuple[str, ...]
    prompt_tokens: int
    tokenizer: str
    exact: bool  # False when the tokenizer is an estimate for this model family
    tool_calls: tuple[ToolCallSeen, ...]
    problems: tuple[str, ...]  # why the conversation is invalid for a chat API; empty when valid

    @property
    def valid(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data: the response's `echo` field."""
        data = asdict(self)
        data.update(roles=list(self.roles), tool_calls=list(data["tool_calls"]), problems=list(self.problems))
        return {**data, "valid": self.valid}

    def text(self) -> str:
        """The report as the reply a person reads."""
        per_role = Counter(self.roles)
        roles = ", ".join(f"{n} {role}" for role, n in per_role.items())
        how = "" if self.exact else ", an estimate"
        parts = [
            f"Echo from context-guard's testing upstream; no model was called. "
            f"{self.messages} messages reached me ({roles}): {self.prompt_tokens:,} prompt tokens "
            f"by {self.tokenizer}{how}."
        ]
        if self.tool_calls:
            calls = ", ".join(
                f"{c.name} ({c.id}) {'with its result' if c.answered else 'WITHOUT a result'}" for c in self.tool_calls
            )
            parts.append(f"Tool calls: {calls}.")
        parts.append("The conversation is valid." if self.valid else f"INVALID: {'; '.join(self.problems)}.")
        return " ".join(parts)


class EchoUpstream:
    """The echo's aiohttp app and the counting it does. Tokenizers load once, on first use."""

    def __init__(self, settings: EchoSettings | None = None, tokenizers: Tokenizers | None = None) -> None:
        self.settings = settings or EchoSettings()
        # Counting needs a model's tokenizer and chat format, which come from its family by name;
        # the window does not matter here, so no model map is read.
        self.registry = ModelRegistry({})
        self._tokenizers = tokenizers

    def counter(self, model: str) -> RequestCounter:
        if self._tokenizers is None:
            self._tokenizers = Tokenizers()
        profile = self.registry.profile(model)
        return RequestCounter(profile, self._tokenizers.get(profile.tokenizer))

    def inspect(self, body: Mapping[str, Any]) -> EchoReport:
        model = str(body.get("model") or "echo")
        counter = self.counter(model)
        count = counter.request(body)
        messages: Sequence[Mapping[str, Any]] = body["messages"]
        results = {
            m["tool_call_id"]: m for m in messages if m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str)
        }
        calls = []
        for message in messages:
            if message.get("role") != "assistant":
                continue
            for call_id, name in zip(call_ids(message), _call_names(message), strict=True):
                result = results.get(call_id)
                tokens = counter.text(_text_of(result.get("content"))) if result is not None else 0
                calls.append(ToolCallSeen(call_id, name, result is not None, tokens))
        return EchoReport(
            model=model,
            messages=len(messages),
            roles=tuple(str(m["role"]) for m in messages),
            prompt_tokens=count.total,
            tokenizer=count.tokenizer,
            exact=counter.tokenizer.exact and counter.profile.tokenizer_exact,
            tool_calls=tuple(calls),
            problems=tuple(validity_problems(messages)),
        )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes, middlewares=[_openai_errors])
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/chat/completions", self.chat)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/models", self.models)
        app.router.add_get("/v1/models/{model}", self.model)
        app.router.add_get("/models/{model}", self.model)
        return app

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = parse_chat(await request.read())  # the guard's own checks: bad bodies get its 400s
        report = self.inspect(body)
        text = report.text()
        completion_tokens = self.counter(report.model).text(text)
        usage = {
            "prompt_tokens": report.prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": report.prompt_tokens + completion_tokens,
        }
        head = {"id": f"chatcmpl-echo-{uuid.uuid4().hex[:16]}", "created": int(time.time()), "model": report.model}
        if body.get("stream") is True:
            options = body.get("stream_options")
            include_usage = isinstance(options, Mapping) and options.get("include_usage") is True
            return await _stream(request, head, text, report, usage if include_usage else None)
        return web.json_response(
            {
                **head,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "refusal": None},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
                "echo": report.to_dict(),
            }
        )

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [_model_entry(m) for m in self.settings.models]})

    async def model(self, request: web.Request) -> web.Response:
        return web.json_response(_model_entry(request.match_info["model"]))


def _model_entry(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": OWNER}


def _call_names(message: Mapping[str, Any]) -> list[str]:
    calls = message.get("tool_calls")
    names = []
    for call in calls if isinstance(calls, list) else []:
        if isinstance(call, Mapping) and isinstance(call.get("id"), str):  # the calls `call_ids` lists
            function = call.get("function")
            name = function.get("name") if isinstance(function, Mapping) else None
            names.append(name if isinstance(name, str) else "?")
    return names


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


async def _stream(
    request: web.Request, head: dict[str, Any], text: str, report: EchoReport, usage: dict[str, int] | None
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    # OpenAI sends `"usage": null` on every chunk when usage was asked for, then one chunk with it.
    extra = {"usage": None} if usage is not None else {}

    def chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        event = {**head, "object": "chat.completion.chunk", "choices": [choice], **extra, **more}
        return f"data: {json.dumps(event)}\n\n".encode()

    await response.write(chunk({"role": "assistant", "content": ""}))
    for piece in _pieces(text):
        await response.write(chunk({"content": piece}))
    await response.write(chunk({}, "stop", echo=report.to_dict()))
    if usage is not None:
        event = {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}
        await response.write(f"data: {json.dumps(event)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


def _pieces(text: str, words: int = 8) -> Iterator[str]:
    """The reply in chunks of a few words, spaces kept, so that joining them gives `text` back."""
    tokens = text.split(" ")
    for i in range(0, len(tokens), words):
        yield " ".join(tokens[i : i + words]) + (" " if i + words < len(tokens) else "")


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _openai_errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except GuardError as exc:
        return web.json_response(exc.to_openai(), status=exc.status)
    except web.HTTPRequestEntityTooLarge:
        return _error(413, "the request body is over the echo upstream's limit", "request_too_large")
    except web.HTTPNotFound:
        known = "POST /v1/chat/completions, GET /v1/models"
        return _error(404, f"the echo upstream serves {known}; not {request.method} {request.path}", "unknown_url")
    except web.HTTPMethodNotAllowed as exc:
        return _error(405, f"{request.method} is not allowed on {request.path}; use {', '.join(exc.allowed_methods)}")
    except (ConnectionError, asyncio.CancelledError):  # the client left: there is no one to answer
        raise
    except Exception as exc:  # still an answer in the API's shape, never a traceback
        return _error(
            500, f"the echo upstream failed on this request: {type(exc).__name__}", "echo_error", "server_error"
        )


def _error(status: int, message: str, code: str | None = None, kind: str = "invalid_request_error") -> web.Response:
    error = {"message": message, "type": kind, "param": None, "code": code}
    return web.json_response({"error": error}, status=status)


def with_echo_upstream(settings: Settings, url: str) -> Settings:
    """`settings` with every route sent to the echo upstream at `url` (`serve --upstream echo`)."""
    upstream = UpstreamSettings(name=UPSTREAM_NAME, base_url=url, kind="echo")
    return settings.revalidated(upstreams={UPSTREAM_NAME: upstream}, routes=(Route(upstream=UPSTREAM_NAME),))


@contextlib.asynccontextmanager
async def running_echo(
    settings: EchoSettings | None = None, tokenizers: Tokenizers | None = None, host: str = "127.0.0.1"
) -> AsyncIterator[str]:
    """Serves the echo on a free port of `host` in the running loop; yields its base URL (`.../v1`)."""
    runner = web.AppRunner(EchoUpstream(settings, tokenizers).app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, 0)
        await site.start()
        port = runner.addresses[0][1]
        yield f"http://{host}:{port}/v1"
    finally:
        await runner.cleanup()


@contextlib.contextmanager
def echo_in_thread(settings: EchoSettings | None = None, host: str = "127.0.0.1") -> Iterator[str]:
    """The echo served from a thread with its own event loop, for a server that owns the main loop
    (`context-guard serve --upstream echo`); yields its base URL and stops it on exit."""
    loop = asyncio.new_event_loop()
    stop: asyncio.Future[None] = loop.create_future()
    ready = threading.Event()
    url: list[str] = []
    failure: list[BaseException] = []

    async def serve() -> None:
        try:
            async with running_echo(settings, host=host) as base_url:
                url.append(base_url)
                ready.set()
                await stop
        except Exception as exc:  # reported to the caller, which is waiting on `ready`
            failure.append(exc)
            ready.set()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), name="echo-upstream", daemon=True)
    thread.start()
    try:
        if not ready.wait(START_TIMEOUT_SECONDS) or failure:
            raise RuntimeError(f"the echo upstream did not start: {failure[0] if failure else 'timed out'}")
        yield url[0]
    finally:
        loop.call_soon_threadsafe(lambda: None if stop.done() else stop.set_result(None))
        thread.join(START_TIMEOUT_SECONDS)
        if not thread.is_alive():
            loop.close()
