"""Backend profiles and discovery, against the servers' own answers (tests/data/backends/).

Each fake server is a real aiohttp app on 127.0.0.1 that replays recorded answers; see
tests/data/backends/README.md for where each recording comes from.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.core.learning.corrections import parse_overflow
from proxy.core.trimming.budget import BudgetPolicy, input_budget
from proxy.server.backends.profiles import (
    OLLAMA_DEFAULT_NUM_CTX,
    BackendOptions,
    budget_policy,
    discover,
    forwardable_request_id,
    llama_server_props,
    model_list_windows,
    ollama_show_window,
    ollama_window,
    profile_for,
    server_root,
    token_count,
)
from proxy.server.backends.tokenize_calls import LlamaCppPythonCalls, LlamaServerCalls, VllmCalls

RECORDED = Path(__file__).parents[2] / "data" / "backends"


def recorded(name: str) -> Any:
    return json.loads((RECORDED / name).read_text(encoding="utf-8"))


def replaying(routes: dict[tuple[str, str], str], delay: float = 0.0) -> tuple[web.Application, list[str]]:
    """An app answering each (method, path) with a recorded file, 404 to anything else; and the
    list of paths it was asked for."""
    asked: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        asked.append(request.path)
        await asyncio.sleep(delay)
        name = routes.get((request.method, request.path))
        if name is None:
            return web.json_response({"detail": "Not Found"}, status=404)
        return web.Response(body=(RECORDED / name).read_bytes(), content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    return app, asked


LLAMA_SERVER = {
    ("GET", "/props"): "llama-server-props.json",
    ("GET", "/v1/models"): "llama-server-models.json",
    ("POST", "/tokenize"): "llama-server-tokenize.json",
    ("POST", "/apply-template"): "llama-server-apply-template.json",
}
LLAMA_CPP_PYTHON = {
    ("GET", "/v1/models"): "llama-cpp-python-models.json",
    ("POST", "/extras/tokenize/count"): "llama-cpp-python-tokenize-count.json",
    ("POST", "/v1/chat/completions"): "llama-cpp-python-completion.json",
}
VLLM = {("GET", "/v1/models"): "vllm-models.json", ("POST", "/tokenize"): "vllm-tokenize.json"}
OLLAMA = {("GET", "/api/version"): "ollama-version.json", ("POST", "/api/show"): "ollama-show.json"}


@pytest.fixture
async def serve(aiohttp_server: Any):
    async def start(routes: dict[tuple[str, str], str], delay: float = 0.0) -> tuple[str, list[str]]:
        app, asked = replaying(routes, delay)
        server = await aiohttp_server(app)
        return str(server.make_url("/v1")), asked

    return start


class TestProfiles:
    def test_hosted_apis_and_vllm_need_prompt_and_max_tokens_to_fit(self):
        assert all(profile_for(k).output_must_fit for k in ("openai", "vertex", "vllm"))

    def test_llama_cpp_lowers_max_tokens_itself_and_may_answer_an_overflow_with_an_empty_stream(self):
        assert not profile_for("llamacpp").output_must_fit
        assert profile_for("llamacpp").empty_stream_on_overflow

    def test_llama_cpp_python_is_sent_only_a_uuid_request_id(self):
        assert not forwardable_request_id(profile_for("llamacpp"), "abc-123")
        assert forwardable_request_id(profile_for("llamacpp"), "0b6f2d1e-8c1a-4a57-9d7e-2f5c3f6a9b10")
        assert forwardable_request_id(profile_for("vllm"), "abc-123")

    def test_ollama_truncates_silently(self):
        assert not profile_for("ollama").signals_overflow

    def test_an_unknown_kind_is_an_error_listing_the_known_ones(self):
        with pytest.raises(ValueError, match="known: openai, vertex, vllm, llamacpp, ollama, generic"):
            profile_for("tgi")

    @pytest.mark.parametrize(
        ("kind", "recording"),
        [
            ("vllm", "vllm-overflow.json"),
            ("llamacpp", "llama-server-overflow.json"),
            ("llamacpp", "llama-cpp-python-overflow.json"),
        ],
    )
    def test_each_overflow_error_says_what_its_profile_expects_and_parses(self, kind, recording):
        raw = (RECORDED / recording).read_bytes()
        assert any(text in raw.decode() for text in profile_for(kind).overflow_texts)
        overflow = parse_overflow(400, raw)
        assert overflow is not None and overflow.limit is not None


class TestBackendOptions:
    @pytest.mark.parametrize(
        ("bad", "words"),
        [
            ({"kind": "tgi"}, "kind must be auto or one of"),
            ({"tokenize": "remote"}, "tokenize must be one of auto, local, backend"),
            ({"discovery_timeout": 0}, "discovery_timeout"),
            ({"tokenize_timeout": 100}, "tokenize_timeout"),
            ({"tokenize_concurrency": 0}, "tokenize_concurrency"),
        ],
    )
    def test_rejects_a_bad_value_naming_it(self, bad, words):
        with pytest.raises(ValueError, match=words):
            BackendOptions(**bad)


class TestParsers:
    def test_llama_server_props_give_its_alias_and_slot_window(self):
        assert llama_server_props(recorded("llama-server-props.json")) == ("qwen2.5-0.5b-instruct", 4096)

    def test_props_of_something_else_are_not_llama_server(self):
        assert llama_server_props({"detail": "Not Found"}) is None

    def test_vllm_states_max_model_len_per_model(self):
        assert model_list_windows(recorded("vllm-models.json")) == (
            "vllm",
            {"meta-llama/Meta-Llama-3.1-8B-Instruct": 8096},
        )

    def test_llama_server_states_n_ctx_in_model_meta(self):
        assert model_list_windows(recorded("llama-server-models.json")) == (
            "llama-server",
            {"qwen2.5-0.5b-instruct": 4096},
        )

    def test_llama_cpp_python_states_no_window(self):
        assert model_list_windows(recorded("llama-cpp-python-models.json")) == (None, {})

    def test_ollama_runs_a_model_with_its_num_ctx(self):
        assert ollama_show_window(recorded("ollama-show.json")) == 4096

    def test_ollama_without_num_ctx_runs_its_default_not_the_trained_length(self):
        assert ollama_show_window(recorded("ollama-show-defaults.json")) == OLLAMA_DEFAULT_NUM_CTX

    @pytest.mark.parametrize(
        ("recording", "count"),
        [
            ("vllm-tokenize.json", 12),
            ("llama-server-tokenize.json", 4),
            ("llama-cpp-python-tokenize-count.json", None),
        ],
    )
    def test_token_counts_are_read_from_every_tokenize_answer(self, recording, count):
        data = recorded(recording)
        assert token_count(data) == (count if count is not None else data["count"])

    def test_server_root_drops_the_api_version(self):
        assert server_root("http://h:8000/v1") == "http://h:8000"
        assert server_root("http://h:8000/api/v1/") == "http://h:8000/api"


class TestDiscover:
    async def test_finds_llama_server_and_its_window(self, serve):
        url, _ = await serve(LLAMA_SERVER)
        async with aiohttp.ClientSession() as session:
            found = await discover(session, url, BackendOptions())
        assert (found.kind, found.flavor) == ("llamacpp", "llama-server")
        assert found.window("qwen2.5-0.5b-instruct") == 4096 and found.window("any-name") == 4096

    async def test_finds_vllm_and_its_window(self, serve):
        url, _ = await serve(VLLM)
        async with aiohttp.ClientSession() as session:
            found = await discover(session, url, BackendOptions())
        assert (found.kind, found.flavor) == ("vllm", "vllm") and found.can_tokenize
        assert found.window("meta-llama/Meta-Llama-3.1-8B-Instruct") == 8096

    async def test_finds_llama_cpp_python_by_its_tokenize_endpoint(self, serve):
        url, asked = await serve(LLAMA_CPP_PYTHON)
        async with aiohttp.ClientSession() as session:
            found = await discover(session, url, BackendOptions())
        assert (found.kind, found.flavor) == ("llamacpp", "llama-cpp-python")
        assert found.window("smollm2") is None and "/extras/tokenize/count" in asked

    async def test_finds_ollama_and_asks_it_per_model(self, serve):
        url, _ = await serve(OLLAMA)
        async with aiohttp.ClientSession() as session:
            found = await discover(session, url, BackendOptions())
            window = await ollama_window(session, url, "llama3.2")
        assert (found.kind, found.flavor, window) == ("ollama", "ollama", 4096)
        assert not found.can_tokenize

    async def test_a_server_that_answers_nothing_known_is_generic(self, serve):
        url, _ = await serve({})
        async with aiohttp.ClientSession() as session:
            found = await discover(session, url, BackendOptions())
        assert found.kind == "generic" and found.notes

    async def test_a_declared_kind_is_kept_when_nothing_answers(self, serve):
        url, _ = await serve({})
        async with aiohttp.ClientSession() as session:
            found = await discover(session, url, BackendOptions(kind="vllm"))
        assert found.kind == "vllm" and found.flavor is None

    async def test_a_slow_server_does_not_hold_discovery_past_its_deadline(self, serve):
        """The server would answer as vLLM after 60 s: what was found is what the deadline left."""
        url, _ = await serve(VLLM, delay=60.0)
        async with aiohttp.ClientSession() as session:
            found = await discover(session, url, BackendOptions(discovery_timeout=0.2))
        assert found.kind == "generic" and "nothing learned" in found.notes[0]

    async def test_hosted_apis_are_never_probed(self, serve):
        url, asked = await serve(VLLM)
        async with aiohttp.ClientSession() as session:
            found = await discover(session, url, BackendOptions(kind="openai"))
        assert found.kind == "openai" and asked == []


class TestTokenizeCalls:
    async def test_llama_server_counts_a_text_and_a_rendered_conversation(self, serve):
        url, asked = await serve(LLAMA_SERVER)
        async with aiohttp.ClientSession() as session:
            calls = LlamaServerCalls(session, url, "qwen2.5-0.5b-instruct")
            assert await calls.text("Hello, world!") == 4
            assert await calls.conversation([{"role": "user", "content": "x"}]) == 4
        assert asked == ["/tokenize", "/apply-template", "/tokenize"]

    async def test_vllm_counts_with_its_tokenize_endpoint(self, serve):
        url, asked = await serve(VLLM)
        async with aiohttp.ClientSession() as session:
            calls = VllmCalls(session, url, "meta-llama/Meta-Llama-3.1-8B-Instruct")
            assert await calls.conversation([{"role": "user", "content": "Hi!"}]) == 12
        assert asked == ["/tokenize"]

    async def test_llama_cpp_python_counts_texts_and_answers_conversations_with_usage(self, serve):
        url, _ = await serve(LLAMA_CPP_PYTHON)
        async with aiohttp.ClientSession() as session:
            calls = LlamaCppPythonCalls(session, url, "smollm2")
            assert await calls.text("x") == recorded("llama-cpp-python-tokenize-count.json")["count"]
            usage = recorded("llama-cpp-python-completion.json")["usage"]["prompt_tokens"]
            assert await calls.conversation([{"role": "user", "content": "x"}]) == usage

    async def test_a_failed_call_is_none_not_an_exception(self, serve):
        url, _ = await serve({})
        async with aiohttp.ClientSession() as session:
            assert await LlamaServerCalls(session, url, "m").text("x") is None


class TestBudgetPolicy:
    def test_a_server_that_must_fit_the_output_keeps_the_configured_policy(self):
        assert budget_policy(profile_for("vllm"), BudgetPolicy()) == BudgetPolicy()

    def test_llama_cpp_and_ollama_budget_for_the_output_they_will_really_leave(self):
        for kind in ("llamacpp", "ollama"):
            policy = budget_policy(profile_for(kind), BudgetPolicy(), min_output=64)
            assert not policy.output_must_fit and policy.min_output == 64
            assert input_budget(2048, {"max_tokens": 4096}, 7, 0, policy).fits

    def test_min_output_tokens_must_not_be_negative(self):
        with pytest.raises(ValueError, match="min_output_tokens"):
            BackendOptions(min_output_tokens=-1)
