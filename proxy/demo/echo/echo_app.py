"""The echo upstream's aiohttp app: one route per API shape, the counting, and how it is run."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from aiohttp import web

from proxy.apis.base import Adapter
from proxy.apis.registry import AdapterRegistry
from proxy.config.settings import Settings
from proxy.config.upstreams import Route, UpstreamSettings
from proxy.core.counting.request_count import RequestCounter
from proxy.core.models.model_registry import ModelRegistry
from proxy.core.trimming.turns import call_ids, validity_problems
from proxy.demo.echo import bedrock_answer, gemini_answer, messages_answer, openai_shapes, responses_answer
from proxy.demo.echo.report import EchoReport, EchoSettings, Reply, ToolCallSeen, call_names, text_of
from proxy.errors import BadRequest, GuardError
from proxy.server.edge.body import bad_body_errors, parse_chat
from proxy.tokenizers.vocabularies import Tokenizers
from proxy.wire.codec import loads

OWNER = "context-guard-echo"
UPSTREAM_NAME = "echo"  # how the guard's log lines and metrics name it
START_TIMEOUT_SECONDS = 30.0
SERVED = (
    "POST /v1/chat/completions, /v1/responses, /v1/completions, /v1/embeddings, /v1/messages, "
    "Gemini's models/{model}:generateContent (streamGenerateContent, countTokens) and interactions, "
    "Bedrock's /model/{modelId}/converse (converse-stream, invoke, invoke-with-response-stream); GET /v1/models"
)

_Render = Callable[[web.Request, Mapping[str, Any], Reply], Awaitable[web.StreamResponse]]


class EchoUpstream:
    """The echo's aiohttp app and the counting it does. Tokenizers load once, on first use."""

    def __init__(self, settings: EchoSettings | None = None, tokenizers: Tokenizers | None = None) -> None:
        self.settings = settings or EchoSettings()
        # Counting needs a model's tokenizer and chat format, which come from its family by name;
        # the window does not matter here, so no model map is read.
        self.registry = ModelRegistry({})
        self.apis = AdapterRegistry()
        self._tokenizers = tokenizers

    def counter(self, model: str, adapter: Adapter | None = None, parsed: Any = None) -> RequestCounter:
        if self._tokenizers is None:
            self._tokenizers = Tokenizers()
        profile = self.registry.profile(model)
        if adapter is not None:
            profile = adapter.profile(profile, parsed)  # what the API adds that no message carries
        return RequestCounter(profile, self._tokenizers.get(profile.tokenizer))

    def inspect(self, body: Mapping[str, Any], adapter: Adapter | None = None, parsed: Any = None) -> EchoReport:
        """The report on a chat-completions body (or, with `adapter` and `parsed`, on another API's
        body through its chat view)."""
        model = str(body.get("model") or "echo")
        counter = self.counter(model, adapter, parsed)
        view = adapter.counted_view(parsed, counter.tokenizer) if adapter is not None else body
        count = counter.request(view)
        messages_: Sequence[Mapping[str, Any]] = view["messages"]
        results = {
            m["tool_call_id"]: m
            for m in messages_
            if m.get("role") == "tool" and isinstance(m.get("tool_call_id"), str)
        }
        calls = []
        for message in messages_:
            if message.get("role") != "assistant":
                continue
            for call_id, name in zip(call_ids(message), call_names(message), strict=True):
                result = results.get(call_id)
                tokens = counter.text(text_of(result.get("content"))) if result is not None else 0
                calls.append(ToolCallSeen(call_id, name, result is not None, tokens))
        return EchoReport(
            model=model,
            messages=len(messages_),
            roles=tuple(str(m["role"]) for m in messages_),
            prompt_tokens=count.total,
            tokenizer=count.tokenizer,
            exact=counter.tokenizer.exact and counter.profile.tokenizer_exact,
            tool_calls=tuple(calls),
            problems=tuple(validity_problems(messages_)),
        )

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.max_body_bytes, middlewares=[_errors])
        for prefix in ("/v1", ""):
            # Azure OpenAI's path, as the guard forwards it (the deployment names the model; the body's too).
            app.router.add_post(f"{prefix}/openai/deployments/{{deployment}}/chat/completions", self.chat)
            app.router.add_post(f"{prefix}/chat/completions", self.chat)
            app.router.add_post(f"{prefix}/responses", self._api("responses", responses_answer.responses))
            app.router.add_post(f"{prefix}/completions", self._api("completions", openai_shapes.completions))
            app.router.add_post(f"{prefix}/messages", self._api("messages", messages_answer.messages))
            app.router.add_post(f"{prefix}/embeddings", self.embeddings)
            app.router.add_get(f"{prefix}/models", self.models)
            app.router.add_get(f"{prefix}/models/{{model}}", self.model)
            app.router.add_post(f"{prefix}/model/{{model}}/{{operation}}", self.bedrock)
        app.router.add_post("/{google:.+}", self.gemini)  # Gemini's paths, at the host's root
        return app

    def _reply(self, report: EchoReport) -> Reply:
        text = report.text()
        completion_tokens = self.counter(report.model).text(text)
        return Reply(report, text, completion_tokens, int(time.time()), uuid.uuid4().hex[:16])

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = parse_chat(await request.read())  # the guard's own checks: bad bodies get its 400s
        return await openai_shapes.chat(request, body, self._reply(self.inspect(body)))

    def _api(self, api: str, render: _Render) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        adapter = self.apis.by_name(api)

        async def handle(request: web.Request) -> web.StreamResponse:
            body = _json_object(await request.read())
            with bad_body_errors():
                parsed = adapter.parse(body)
            report = self.inspect({**parsed.chat, "model": parsed.model or body.get("model")}, adapter, parsed)
            return await render(request, body, self._reply(report))

        return handle

    async def gemini(self, request: web.Request) -> web.StreamResponse:
        """Gemini's paths (the model and the method from the path, as the guard reads them)."""
        endpoint = self.apis.endpoint_for(request.path)
        if endpoint is None or not endpoint.at_host_root:
            raise web.HTTPNotFound()
        body = _json_object(await request.read())
        with bad_body_errors():
            parsed = endpoint.parse(body)
        if endpoint.path_model is None:  # the Interactions API: the model is the body's
            report = self.inspect({**parsed.chat, "model": parsed.model}, endpoint.adapter, parsed)
            return await gemini_answer.interaction(request, body, self._reply(report))
        report = self.inspect({**parsed.chat, "model": endpoint.path_model}, endpoint.adapter, parsed)
        return await gemini_answer.generate_content(request, request.path.rpartition(":")[2], self._reply(report))

    async def bedrock(self, request: web.Request) -> web.StreamResponse:
        """bedrock-runtime's paths: the model and the operation from the path, as the guard sends them."""
        model, operation = request.match_info["model"], request.match_info["operation"]
        endpoint = self.apis.endpoint_for(f"/model/{model.replace('/', '%2F')}/{operation}")
        if endpoint is None or endpoint.local:
            raise web.HTTPNotFound()
        body = _json_object(await request.read())
        with bad_body_errors():
            parsed = endpoint.parse(body)
        report = self.inspect({**parsed.chat, "model": parsed.model}, endpoint.adapter, parsed)
        return await bedrock_answer.bedrock(request, operation, body, self._reply(report))

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        body = _json_object(await request.read())
        counter = self.counter(str(body.get("model") or "echo"))
        return openai_shapes.embeddings(body, counter.text)

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [_model_entry(m) for m in self.settings.models]})

    async def model(self, request: web.Request) -> web.Response:
        return web.json_response(_model_entry(request.match_info["model"]))


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = loads(raw)
    except ValueError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def _model_entry(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": OWNER}


_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: _Handler) -> web.StreamResponse:
    """Every failure answered in the shape of the API the path serves (Anthropic's on /messages)."""
    error = _error if not request.path.rstrip("/").endswith("/messages") else _anthropic_error
    if ":" in request.path.rpartition("/")[2]:  # Gemini's `models/{model}:method`
        error = _google_error
    elif request.path.endswith("/interactions"):
        error = _interactions_error
    elif "/model/" in request.path:  # bedrock-runtime's
        error = _bedrock_error
    try:
        return await handler(request)
    except GuardError as exc:
        return error(exc.status, exc.message, exc.code, exc.error_type, exc.param)
    except web.HTTPRequestEntityTooLarge:
        return error(413, "the request body is over the echo upstream's limit", "request_too_large")
    except web.HTTPNotFound:
        return error(404, f"the echo upstream serves {SERVED}; not {request.method} {request.path}", "unknown_url")
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(exc.allowed_methods)
        return error(405, f"{request.method} is not allowed on {request.path}; use {allowed}")
    except (ConnectionError, asyncio.CancelledError):  # the client left: there is no one to answer
        raise
    except Exception as exc:  # still an answer in the API's shape, never a traceback
        return error(
            500, f"the echo upstream failed on this request: {type(exc).__name__}", "echo_error", "server_error"
        )


def _error(
    status: int, message: str, code: str | None = None, kind: str = "invalid_request_error", param: str | None = None
) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": param, "code": code}}, status=status)


def _anthropic_error(status: int, message: str, *_: str | None) -> web.Response:
    return messages_answer.anthropic_error(status, message)


def _google_error(status: int, message: str, *_: str | None) -> web.Response:
    return gemini_answer.google_error(status, message)


def _bedrock_error(status: int, message: str, *_: str | None) -> web.Response:
    return bedrock_answer.bedrock_error(status, message)


def _interactions_error(status: int, message: str, *_: str | None) -> web.Response:
    return gemini_answer.interactions_failure(status, message)


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
