"""Every config in examples/ loads through the settings loader and serves through the real app, as
its comment says, in front of fakes in this process.

Each `examples/*.yaml` is found by its suffix (one added later is covered the day it lands), its
`${VAR}`s and `api_key_env`s set to dummy values, and every upstream pointed at the built-in echo
upstream (its `kind` kept); a request for a model of each route is then answered through it.
`local-servers.yaml` is also served in front of fakes of the servers it names (vLLM, llama-server,
Ollama; tests/support/local_servers.py), whose own tokenizers the guard must count with.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.config.settings import Settings, load_settings
from proxy.demo.echo import running_echo
from tests.support.local_servers import REPLY, FakeLlamaServer, FakeOllama, FakeVllm, prompt_tokens
from tests.support.upstream import FakeUpstream

EXAMPLES = Path(__file__).parents[3] / "examples"
CONFIGS = sorted(EXAMPLES.glob("*.yaml"))
DUMMY = "example-dummy"


def dummy_env(path: Path) -> dict[str, str]:
    """Every variable the file reads (`${VAR}`, `${VAR:-default}`, `api_key_env: VAR`), set to a dummy."""
    text = path.read_text(encoding="utf-8")
    names = re.findall(r"\$\{(\w+)", text) + re.findall(r"api_key_env:\s*(\w+)", text)
    return dict.fromkeys(names, DUMMY)


def served_by(settings: Settings, urls: dict[str, str]) -> Settings:
    """`settings` with each upstream's base URL replaced by `urls[name]`, and no token fetched (no
    command run, no Application Default Credentials looked for)."""
    upstreams = {
        name: dataclasses.replace(upstream, base_url=urls[name], token_command=None, token_file=None, auth=None)
        if upstream.kind != "bedrock"
        else dataclasses.replace(upstream, base_url=urls[name], auth=None, api_key_env="EXAMPLE_BEDROCK_KEY")
        for name, upstream in settings.upstreams.items()
    }  # a Bedrock upstream takes a Bedrock API key instead of the AWS credentials it would look for
    return settings.revalidated(upstreams=upstreams)


def a_model_for(pattern: str) -> str:
    """A model name the route's `match` takes: the name itself, or the glob filled in."""
    return pattern.replace("*", "example").replace("?", "x")


def requests_of(settings: Settings) -> list[tuple[str, str, str]]:
    """(model, upstream, API) for one model of each route that is the first to match it, sent in
    the first of chat or Messages its upstream serves."""
    sent = []
    for route in settings.routes:
        model = a_model_for(route.match)
        if next(r for r in settings.routes if r.matches(model)) is not route:
            continue  # shadowed by a route above it
        upstream = settings.upstreams[route.upstream]
        api = next((api for api in ("chat", "messages") if upstream.serves(api)), None)
        if api is not None:
            sent.append((model, route.upstream, api))
    return sent


async def post(proxy: Any, model: str, api: str, key: str | None) -> tuple[int, dict[str, str], Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "Hello from an example"}]}
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    path = "/v1/chat/completions"
    if api == "messages":
        body["max_tokens"] = 64
        headers = {"anthropic-version": "2023-06-01", **({} if key is None else {"x-api-key": key})}
        path = "/v1/messages"
    async with aiohttp.ClientSession() as session, session.post(proxy.make_url(path), json=body, headers=headers) as r:
        return r.status, dict(r.headers), await r.json(content_type=None)


class TestEveryExampleConfig:
    @pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
    async def test_it_loads_and_serves_a_model_of_each_route_through_the_real_app(self, path, start_proxy, logs):
        settings = load_settings(path, dummy_env(path))
        async with running_echo() as echo:
            proxy = await start_proxy(served_by(settings, dict.fromkeys(settings.upstreams, echo)))
            sent = requests_of(settings)
            for model, _, api in sent:
                status, headers, answer = await post(proxy, model, api, DUMMY)
                assert status == 200, (model, answer)
                assert "echo" in answer and int(headers["x-context-guard-tokens-before"]) > 0
        assert sent and [(e["model"], e["upstream"]) for e in logs.events("request")] == [(m, u) for m, u, _ in sent]

    @pytest.mark.parametrize(
        "path", [p for p in CONFIGS if "client_keys" in p.read_text(encoding="utf-8")], ids=lambda p: p.name
    )
    async def test_one_with_client_keys_refuses_a_client_without_one(self, path, start_proxy):
        settings = load_settings(path, dummy_env(path))
        async with running_echo() as echo:
            proxy = await start_proxy(served_by(settings, dict.fromkeys(settings.upstreams, echo)))
            model, _, api = requests_of(settings)[0]
            assert (await post(proxy, model, api, None))[0] == 401
            assert (await post(proxy, model, api, "sk-not-the-proxy-key"))[0] == 401


LOCAL = EXAMPLES / "local-servers.yaml"
CONVERSATION = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "What is the capital of Portugal?"},
    {"role": "assistant", "content": "Lisbon is the capital of Portugal."},
    {"role": "user", "content": "And its largest river?"},
]


@pytest.fixture
async def local_servers(aiohttp_server: Any) -> dict[str, Any]:
    """The servers local-servers.yaml names, by upstream name, each started with a window other
    than the one the file writes for its model."""
    fakes = {
        "vllm": FakeVllm("meta-llama/Llama-3.1-8B-Instruct", 20000),
        "llamacpp": FakeLlamaServer("local-qwen", 8192),
        "ollama": FakeOllama("llama3.2", 6144),
    }
    for fake in fakes.values():
        fake.url = str((await aiohttp_server(fake.app())).make_url("/v1"))
    return fakes


class TestLocalServersExample:
    @pytest.mark.parametrize(
        ("model", "upstream"), [("meta-llama/Llama-3.1-8B-Instruct", "vllm"), ("local-qwen", "llamacpp")]
    )
    async def test_vllm_and_llama_server_count_with_their_own_tokenizer_and_window(
        self, local_servers, start_proxy, logs, model, upstream
    ):
        fake = local_servers[upstream]
        proxy = await start_proxy(served_by(load_settings(LOCAL, {}), {n: f.url for n, f in local_servers.items()}))
        async with aiohttp.ClientSession() as session:
            body = {"model": model, "messages": CONVERSATION}
            async with session.post(proxy.make_url("/v1/chat/completions"), json=body) as r:
                assert r.status == 200 and (await r.json())["choices"][0]["message"]["content"] == REPLY
                counted = int(r.headers["x-context-guard-tokens-before"])
        (event,) = logs.events("request")
        assert counted == prompt_tokens(CONVERSATION) and fake.tokenize_calls > 0  # the server's count, exactly
        assert (event["count_source"], event["exact"], event["upstream"]) == ("backend", True, upstream)
        assert (event["context_window"], event["window_source"]) == (fake.window, "backend")
        assert fake.chats == [body]  # it fitted: forwarded as sent

    async def test_an_ollama_model_is_counted_locally_in_the_window_ollama_runs_it_with(
        self, local_servers, start_proxy, logs
    ):
        """Ollama cannot tokenize: the count is the guard's own (the Llama 3 vocabulary, or the
        family's bound where that vocabulary is not installed), never a refusal."""
        proxy = await start_proxy(served_by(load_settings(LOCAL, {}), {n: f.url for n, f in local_servers.items()}))
        async with aiohttp.ClientSession() as session:
            body = {"model": "llama3.2", "messages": CONVERSATION}
            async with session.post(proxy.make_url("/v1/chat/completions"), json=body) as r:
                assert r.status == 200 and (await r.json())["choices"][0]["message"]["content"] == REPLY
        (event,) = logs.events("request")
        assert event["upstream"] == "ollama" and event["count_source"] in ("model", "estimate")
        assert (event["context_window"], event["window_source"]) == (6144, "backend")
        assert local_servers["ollama"].chats == [body]

    async def test_a_server_down_at_start_is_budgeted_with_the_window_the_file_writes(
        self, local_servers, start_proxy, logs, unused_tcp_port
    ):
        urls = {n: f.url for n, f in local_servers.items()} | {"vllm": f"http://127.0.0.1:{unused_tcp_port}/v1"}
        proxy = await start_proxy(served_by(load_settings(LOCAL, {}), urls))
        async with aiohttp.ClientSession() as session:
            body = {"model": "meta-llama/Llama-3.1-8B-Instruct", "messages": CONVERSATION}
            async with session.post(proxy.make_url("/v1/chat/completions"), json=body) as r:
                assert r.status in (502, 503)
        (event,) = logs.events("request")
        assert (event["context_window"], event["window_source"]) == (32768, "config")


def distinct_env(path: Path) -> dict[str, str]:
    """Every variable the file reads, each set to a value naming it, so a test can tell them apart."""
    return {name: f"value-of-{name}" for name in dummy_env(path)}


class TestWhatEachExampleClaims:
    @pytest.mark.parametrize(
        "path", [p for p in CONFIGS if "api_key_env" in p.read_text(encoding="utf-8")], ids=lambda p: p.name
    )
    async def test_each_upstream_gets_the_key_its_variable_holds_never_the_clients(
        self, path, start_proxy, aiohttp_server
    ):
        """The comment's promise: clients hold a proxy key (or none), the provider's key comes from
        `api_key_env` in the header its kind uses (Bearer; `x-api-key` with `anthropic-version` for
        Anthropic)."""
        env = distinct_env(path)
        settings = load_settings(path, env)
        fakes = {name: FakeUpstream(every_shape=True) for name in settings.upstreams}
        urls = {name: str((await aiohttp_server(fake.app())).make_url("/v1")) for name, fake in fakes.items()}
        proxy = await start_proxy(served_by(settings, urls))
        client_key = env.get("CONTEXT_GUARD_KEY", "sk-the-clients-own")
        with pytest.MonkeyPatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            for model, upstream_name, api in requests_of(settings):
                status, _, answer = await post(proxy, model, api, client_key)
                assert status == 200, (model, answer)
                upstream = settings.upstreams[upstream_name]
                got = fakes[upstream_name].received[-1].headers
                key = env[upstream.api_key_env]
                if upstream.kind == "anthropic":
                    assert got.get("x-api-key") == key and got.get("anthropic-version")
                else:
                    assert got.get("Authorization") == f"Bearer {key}"
                assert client_key not in str(got)

    @pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
    def test_each_upstream_names_its_kind_as_the_readme_config_does(self, path):
        settings = load_settings(path, dummy_env(path))
        assert all(upstream.kind not in ("auto", "generic") for upstream in settings.upstreams.values()), path.name

    @pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
    def test_one_that_listens_beyond_loopback_has_client_keys(self, path):
        """The recommended production setting: beyond loopback, clients present a proxy key."""
        server = load_settings(path, dummy_env(path)).server
        assert server.host in ("127.0.0.1", "localhost", "::1") or server.client_keys, path.name
