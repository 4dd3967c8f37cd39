"""Fakes of the local servers `examples/local-servers.yaml` names: vLLM, llama.cpp's llama-server
and Ollama, each a real aiohttp app answering the endpoints the guard asks at start and per
request, in the shapes of tests/data/backends/ (what those servers answer); a chat completion as
every fake upstream builds it (`proxy.demo.provider_answers`).

Their tokenizer is a model in plain Python, far from any real vocabulary on purpose: a token is a
whitespace-separated word, and a chat is rendered as `<|im_start|> role \\n content <|im_end|> \\n`
per message, then `<|im_start|> assistant \\n`, after a BOS token. A count the guard gives equal to
`prompt_tokens(messages)` therefore came from the server, not from any tokenizer of the guard's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from proxy.demo import provider_answers as answers

REPLY = "Answered by a fake local server."


def words(text: str) -> int:
    return len(text.split())


def rendered(messages: list[dict[str, Any]]) -> str:
    """The chat as the fake's template writes it, generation prompt included."""
    turns = "".join(f"<|im_start|> {m['role']} \n {m.get('content') or ''} <|im_end|> \n" for m in messages)
    return turns + "<|im_start|> assistant \n"


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """The prompt the server would run: BOS and the rendered chat."""
    return 1 + words(rendered(messages))


@dataclass
class LocalServer:
    """One fake server: `model` served with a `window`-token context; `tokenize_calls` counts the
    tokenize requests it answered, `chats` the chat bodies it was sent. Each subclass adds its
    server's own endpoints in `routes`."""

    model: str
    window: int
    url: str = ""  # its base URL (`.../v1`), once served
    tokenize_calls: int = 0
    chats: list[dict[str, Any]] = field(default_factory=list)

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.chats.append(body)
        usage = answers.Usage(input=prompt_tokens(body["messages"]), output=6)
        return web.json_response(answers.chat_completion(body["model"], REPLY, ids="local", created=0, usage=usage))

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self.routes(app)
        return app

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError


class FakeVllm(LocalServer):
    """vLLM: `GET /v1/models` states `max_model_len`; `POST /tokenize` counts a `prompt`, or
    `messages` rendered by the template (BOS added unless `add_special_tokens` is false)."""

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/tokenize", self.tokenize)

    async def models(self, request: web.Request) -> web.Response:
        entry = {"id": self.model, "object": "model", "owned_by": "vllm", "max_model_len": self.window}
        return web.json_response({"object": "list", "data": [entry]})

    async def tokenize(self, request: web.Request) -> web.Response:
        self.tokenize_calls += 1
        body = await request.json()
        if "messages" in body:
            count = prompt_tokens(body["messages"])
        else:
            count = words(body["prompt"]) + (1 if body.get("add_special_tokens", True) else 0)
        return web.json_response({"count": count, "max_model_len": self.window, "tokens": list(range(count))})


class FakeLlamaServer(LocalServer):
    """llama.cpp's llama-server: `GET /props` states `n_ctx`; `POST /apply-template` renders a chat,
    `POST /tokenize` counts a text (BOS added with `add_special`)."""

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/props", self.props)
        app.router.add_post("/apply-template", self.apply_template)
        app.router.add_post("/tokenize", self.tokenize)

    async def props(self, request: web.Request) -> web.Response:
        settings = {"n_ctx": self.window, "params": {"n_predict": -1}}
        return web.json_response({"default_generation_settings": settings, "model_alias": self.model})

    async def apply_template(self, request: web.Request) -> web.Response:
        return web.json_response({"prompt": rendered((await request.json())["messages"])})

    async def tokenize(self, request: web.Request) -> web.Response:
        self.tokenize_calls += 1
        body = await request.json()
        count = words(body["content"]) + (1 if body.get("add_special") else 0)
        return web.json_response({"tokens": list(range(count))})


class FakeOllama(LocalServer):
    """Ollama: `GET /api/version`, and `POST /api/show` giving the `num_ctx` a model runs with. It
    has no tokenize endpoint."""

    def routes(self, app: web.Application) -> None:
        app.router.add_get("/api/version", self.version)
        app.router.add_post("/api/show", self.show)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": "0.5.7"})

    async def show(self, request: web.Request) -> web.Response:
        info = {"general.architecture": "llama", "llama.context_length": 131072}
        return web.json_response({"parameters": f"num_ctx                        {self.window}", "model_info": info})
