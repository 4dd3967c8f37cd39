"""Choosing how to count a request for its upstream, and learning from each response.

The upstream is an in-process imitation of llama-cpp-python's server: a token is a word, its
template is ChatML, `/extras/tokenize/count` counts words and a chat completion reports
`usage.prompt_tokens` of the rendered prompt.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.core.counting.request_count import RequestCounter
from proxy.core.counting.tokenizer import CharEstimateTokenizer, EncoderTokenizer
from proxy.core.models.model_registry import ModelRegistry
from proxy.server.backends.catalogue import MODELS_KEPT, Backends, Reach
from proxy.server.backends.profiles import BackendOptions, Discovery
from proxy.server.request.gateway import GATEWAY
from tests.support.guard import plan_with


def words(text: str) -> int:
    return len(text.split())


def rendered(messages: list[dict[str, Any]]) -> int:
    return sum(3 + words(m.get("content") or "") for m in messages) + 2


def llama_cpp_python_like() -> tuple[web.Application, list[str]]:
    asked: list[str] = []

    async def count(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.json_response({"count": words((await request.json())["input"])})

    async def chat(request: web.Request) -> web.Response:
        asked.append(request.path)
        body = await request.json()
        return web.json_response({"choices": [], "usage": {"prompt_tokens": rendered(body["messages"])}})

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "/models/smol.gguf", "owned_by": "me"}]})

    app = web.Application()
    app.router.add_post("/extras/tokenize/count", count)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    return app, asked


@pytest.fixture
async def llama(aiohttp_server: Any) -> tuple[str, list[str]]:
    app, asked = llama_cpp_python_like()
    server = await aiohttp_server(app)
    return str(server.make_url("/v1")), asked


def chat(turns: int) -> dict[str, Any]:
    messages = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        messages += [{"role": "user", "content": f"tell me fact {i} please"}, {"role": "assistant", "content": "ok"}]
    return {"model": "smol", "messages": [*messages, {"role": "user", "content": "thanks"}]}


REGISTRY = ModelRegistry({"gpt-4o": {"max_input_tokens": 128000, "mode": "chat"}})
ESTIMATE = CharEstimateTokenizer(3.0)
EXACT = EncoderTokenizer("words", str.split)


async def discovered_choice(url: str) -> tuple[Backends, Any]:
    """Backends that discovered the llama-cpp-python-like upstream at `url`, and their choice for a
    two-message chat to model `smol`."""
    backends = Backends()
    async with aiohttp.ClientSession() as session:
        await backends.discover(session, "local", url)
        choice = await backends.choose(
            Reach(session, "local", url), "smol", chat(2), REGISTRY.profile("smol"), ESTIMATE
        )
    return backends, choice


class TestChoose:
    async def test_uses_the_backend_tokenizer_where_the_upstream_has_one(self, llama):
        _, choice = await discovered_choice(llama[0])
        assert choice.source == "backend" and choice.bypasses_cache
        assert RequestCounter(choice.profile, choice.tokenizer).request(chat(2)).total == rendered(chat(2)["messages"])

    async def test_the_backend_is_asked_with_the_credential_of_the_moment(self, aiohttp_server):
        """A token from `token_command` or `token_file` is refreshed: the tokenize calls must carry
        the new one, not the one the counter for that model was made with."""
        app, _ = llama_cpp_python_like()
        seen: list[str | None] = []

        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            if "tokenize" in request.path:
                seen.append(request.headers.get("Authorization"))
            return await handler(request)

        app.middlewares.append(record)
        url = str((await aiohttp_server(app)).make_url("/v1"))
        counting, asked_with = Backends(), {}
        async with aiohttp.ClientSession() as session:
            await counting.discover(session, "local", url)
            for token, turns in (("one", 2), ("two", 3)):  # the second has a new message to count
                seen.clear()
                headers = {"Authorization": f"Bearer {token}"}
                profile = REGISTRY.profile("smol")
                await counting.choose(Reach(session, "local", url, headers), "smol", chat(turns), profile, ESTIMATE)
                asked_with[token] = set(seen)
        assert asked_with == {"one": {"Bearer one"}, "two": {"Bearer two"}}

    async def test_tokenize_local_keeps_the_guard_s_own_count(self, llama):
        url, asked = llama
        counting = Backends({"local": BackendOptions(tokenize="local")})
        async with aiohttp.ClientSession() as session:
            await counting.discover(session, "local", url)
            asked.clear()
            choice = await counting.choose(
                Reach(session, "local", url), "smol", chat(2), REGISTRY.profile("smol"), ESTIMATE
            )
        assert choice.source == "estimate" and asked == []

    async def test_an_exact_model_tokenizer_is_used_when_the_upstream_cannot_tokenize(self):
        counting = Backends()
        async with aiohttp.ClientSession() as session:
            choice = await counting.choose(
                Reach(session, "openai", "http://unused/v1"), "gpt-4o", chat(1), REGISTRY.profile("gpt-4o"), EXACT
            )
        assert choice.source == "model" and choice.tokenizer is EXACT

    async def test_asking_for_the_backend_tokenizer_where_there_is_none_says_so(self):
        counting = Backends({"hosted": BackendOptions(tokenize="backend")})
        async with aiohttp.ClientSession() as session:
            choice = await counting.choose(
                Reach(session, "hosted", "http://unused/v1"), "smol", chat(1), REGISTRY.profile("smol"), ESTIMATE
            )
        assert choice.source == "estimate" and "no tokenize endpoint" in (choice.note or "")

    async def test_without_the_backend_s_tokenizer_the_choice_is_known_without_awaiting_and_is_chooses(self, llama):
        url, _ = llama
        counting = Backends({"local": BackendOptions(tokenize="local")})
        async with aiohttp.ClientSession() as session:
            await counting.discover(session, "local", url)
            awaited = await counting.choose(
                Reach(session, "local", url), "smol", chat(2), REGISTRY.profile("smol"), ESTIMATE
            )
        assert counting.local_choice("local", "smol", REGISTRY.profile("smol"), ESTIMATE) == awaited

    async def test_with_the_backend_s_tokenizer_to_ask_nothing_is_chosen_without_awaiting(self, llama):
        url, _ = llama
        counting = Backends()
        async with aiohttp.ClientSession() as session:
            await counting.discover(session, "local", url)
        assert counting.local_choice("local", "smol", REGISTRY.profile("smol"), ESTIMATE) is None


class TestKnownWindow:
    def test_an_upstream_not_discovered_states_no_window_and_need_not_be_asked(self):
        assert Backends().known_window("openai", "gpt-4o") == (True, None)

    def test_a_discovered_server_s_window_is_known_without_asking(self):
        counting = Backends(discoveries={"local": Discovery("llamacpp", windows={"smol": 4096})})
        assert counting.known_window("local", "smol") == (True, 4096)

    async def test_an_ollama_model_not_asked_yet_must_be_asked_and_is_known_after(self, aiohttp_server):
        app = web.Application()

        async def show(request: web.Request) -> web.Response:
            return web.json_response({"model_info": {"llama.context_length": 65536}, "parameters": "num_ctx 8192"})

        app.router.add_post("/api/show", show)
        server = await aiohttp_server(app)
        counting = Backends(discoveries={"ollama": Discovery("ollama")})
        before = counting.known_window("ollama", "llama3")
        async with aiohttp.ClientSession() as session:
            asked = await counting.window(Reach(session, "ollama", str(server.make_url("/v1"))), "llama3")
        assert before == (False, None) and counting.known_window("ollama", "llama3") == (True, asked) == (True, 8192)

    async def test_what_is_kept_per_model_stays_bounded_whatever_names_clients_send(self, aiohttp_server):
        async def show(request: web.Request) -> web.Response:
            return web.json_response({"parameters": "num_ctx 8192"})

        app = web.Application()
        app.router.add_post("/api/show", show)
        server = await aiohttp_server(app)
        counting = Backends(discoveries={"ollama": Discovery("ollama")})
        async with aiohttp.ClientSession() as session:
            for i in range(MODELS_KEPT + 50):
                await counting.window(Reach(session, "ollama", str(server.make_url("/v1"))), f"made-up-{i}")
        assert len(counting._windows) == MODELS_KEPT
        assert counting.known_window("ollama", f"made-up-{MODELS_KEPT + 49}") == (True, 8192)  # the newest kept
        assert counting.known_window("ollama", "made-up-0") == (False, None)  # the oldest asked again


class TestObserve:
    async def test_an_estimate_learns_from_usage_and_is_then_calibrated(self):
        counting = Backends()
        profile = REGISTRY.profile("smol")
        async with aiohttp.ClientSession() as session:
            for _ in range(4):
                choice = await counting.choose(
                    Reach(session, "up", "http://unused/v1"), "smol", chat(30), profile, ESTIMATE
                )
                counting.observe(choice, 300, chat(30))
            choice = await counting.choose(
                Reach(session, "up", "http://unused/v1"), "smol", chat(30), profile, ESTIMATE
            )
        assert choice.source == "calibrated" and choice.calibration is not None
        assert choice.calibration.observations == 4

    async def test_the_backend_s_or_the_model_s_own_count_learns_nothing(self, llama):
        counting, choice = await discovered_choice(llama[0])
        assert counting.observe(choice, 999, chat(2)) is None
        assert counting.calibration.get("local", "smol") is None


class TestSharedCountCache:
    async def test_a_request_counted_with_the_model_s_own_tokenizer_is_served_from_the_cache_when_re_sent(
        self, proxy, upstream
    ):
        from tests.server.conftest import long_conversation

        body = {"model": "gpt-4o", "messages": long_conversation(turns=20)}
        cache = proxy.app[GATEWAY].models.cache
        async with aiohttp.ClientSession() as client:
            async with client.post(proxy.make_url("/v1/chat/completions"), json=body) as response:
                assert response.status == 200
            assert len(cache) >= len(body["messages"])
            counted, hits = cache.misses, cache.hits
            async with client.post(proxy.make_url("/v1/chat/completions"), json=body) as response:
                assert response.status == 200
        assert cache.misses == counted  # nothing counted again
        assert cache.hits > hits

    async def test_a_calibrated_estimate_counts_without_the_shared_cache(self, model_map):
        from proxy.apis.fitting import Counting
        from proxy.config.settings import Settings
        from proxy.server.backends.models import Models

        guard = Models(Settings(), model_map)
        profile = guard.profile("gpt-4o")
        plan_with(guard, chat(3), "gpt-4o", counting=Counting(profile, CharEstimateTokenizer(2.5), model="gpt-4o"))
        assert len(guard.cache) == 0
        plan_with(guard, chat(3), "gpt-4o", counting=Counting(profile, guard.tokenizer(profile), model="gpt-4o"))
        assert len(guard.cache) > 0

    async def test_the_shared_cache_holds_to_the_configured_memory(self, model_map):
        from proxy.config.settings import Settings
        from proxy.server.backends.models import Models

        guard = Models(Settings.of({"tokenizers": {"cache_bytes": 8192}}), model_map)
        for n in range(20):
            body = chat(6)
            body["messages"][0]["content"] = f"conversation {n}"  # every conversation new
            plan_with(guard, body, "gpt-4o")
        assert 0 < guard.cache.bytes <= 8192


class TestOffLoop:
    async def test_work_runs_in_a_large_body_thread_below_the_loop_s_priority(self):
        import os
        import threading

        from proxy.server.threads.placement import off_loop
        from proxy.tokenizers.vocabularies import BACKGROUND_NICENESS

        def where() -> tuple[str, int]:
            return threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

        name, niceness = await off_loop(where)
        assert name.startswith("context-guard-large")
        assert niceness == min(19, os.getpriority(os.PRIO_PROCESS, 0) + BACKGROUND_NICENESS)

    async def test_the_caller_s_context_variables_go_along(self):
        import contextvars

        from proxy.server.threads.placement import off_loop

        request_id = contextvars.ContextVar("request_id", default="none")
        request_id.set("r-1")
        assert await off_loop(request_id.get) == "r-1"


class TestPlannedNearLoop:
    """A plan is made on the loop while its new work stays within the inline budget; past that,
    or for a body over `INLINE_PLAN_BYTES`, in the medium-body threads."""

    @staticmethod
    def counting(texts: list[str]) -> tuple[list[str], Any]:
        import threading

        from proxy.core.counting.count_cache import CountCache

        cache, where = CountCache(), []
        tokenizer = EncoderTokenizer("chars", lambda text: [0] * len(text))

        def plan() -> int:
            where.append(threading.current_thread().name)
            return sum(cache.count_many(tokenizer, texts))

        return where, plan

    async def test_a_plan_of_cached_counts_and_a_short_new_text_runs_on_the_loop(self):
        import threading

        from proxy.server.threads.placement import INLINE_BYTES, planned_near_loop

        where, plan = self.counting(["a" * 300, "b" * (INLINE_BYTES - 300)])
        assert await planned_near_loop(plan, size=90_000, client="c") == INLINE_BYTES
        assert where == [threading.current_thread().name]

    async def test_a_plan_that_would_overspend_is_made_again_in_a_thread(self):
        from proxy.server.threads.placement import INLINE_BYTES, planned_near_loop

        where, plan = self.counting(["a" * (INLINE_BYTES + 1)])
        assert await planned_near_loop(plan, size=90_000, client="c") == INLINE_BYTES + 1
        assert len(where) == 2
        assert where[1].startswith("context-guard-medium")

    async def test_what_the_loop_counted_before_overspending_is_not_counted_again(self):
        from proxy.core.counting.count_cache import CountCache
        from proxy.server.threads.placement import INLINE_BYTES, planned_near_loop

        encoded: list[int] = []
        tokenizer = EncoderTokenizer("chars", lambda text: encoded.append(len(text)) or [0] * len(text))
        cache = CountCache(min_chars=0)
        texts = ["a" * 100, "b" * INLINE_BYTES]

        def plan() -> int:
            return sum(cache.count(tokenizer, t) for t in texts)

        assert await planned_near_loop(plan, size=90_000, client="c") == INLINE_BYTES + 100
        assert encoded == [100, INLINE_BYTES]  # the first text once, on the loop; the second in the thread

    async def test_a_body_over_the_inline_plan_size_is_planned_in_a_thread(self):
        from proxy.server.threads.placement import INLINE_PLAN_BYTES, planned_near_loop

        where, plan = self.counting(["a"])
        await planned_near_loop(plan, size=INLINE_PLAN_BYTES + 1, client="c")
        assert len(where) == 1 and where[0].startswith("context-guard-medium")
