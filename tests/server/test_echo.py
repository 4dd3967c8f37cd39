"""The built-in echo upstream: what it reports, how it answers (JSON, SSE, errors), how it runs."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

import pytest
from openai import AsyncOpenAI

from proxy.server.echo import EchoSettings, EchoUpstream, echo_in_thread, running_echo
from tests.core.test_tokens import COOKBOOK_MESSAGES, COOKBOOK_TOOL_MESSAGES, COOKBOOK_TOOLS


def call(call_id: str, name: str = "run_tests") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


AGENT = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Why is CI red?"},
    {"role": "assistant", "content": None, "tool_calls": [call("call_1"), call("call_2", "read_file")]},
    {"role": "tool", "tool_call_id": "call_1", "content": "1 failed, 240 passed"},
    {"role": "tool", "tool_call_id": "call_2", "content": "def output_reserve(window): ..."},
    {"role": "user", "content": "Fix it."},
]


@pytest.fixture
def echo() -> EchoUpstream:
    return EchoUpstream()


@pytest.fixture
async def client(aiohttp_client: Any, echo: EchoUpstream) -> Any:
    return await aiohttp_client(EchoUpstream(EchoSettings(models=("echo", "small-local"), max_body_bytes=4096)).app())


def refuses_connections(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


class TestEchoSettings:
    def test_an_empty_model_list_is_refused_with_the_reason(self):
        with pytest.raises(ValueError, match="non-empty list of model ids"):
            EchoSettings(models=())

    def test_a_blank_model_id_is_refused(self):
        with pytest.raises(ValueError, match="model ids"):
            EchoSettings(models=("echo", " "))

    def test_a_body_limit_below_one_kibibyte_is_refused(self):
        with pytest.raises(ValueError, match="max_body_bytes"):
            EchoSettings(max_body_bytes=10)


class TestInspect:
    @pytest.mark.parametrize(("model", "expected"), [("gpt-4", 129), ("gpt-4o", 124), ("gpt-4o-mini", 124)])
    def test_its_prompt_count_is_what_openai_reports_for_the_cookbook_messages(self, echo, model, expected):
        assert echo.inspect({"model": model, "messages": COOKBOOK_MESSAGES}).prompt_tokens == expected

    def test_its_prompt_count_includes_tool_definitions_as_openai_reports_them(self, echo):
        body = {"model": "gpt-4o", "messages": COOKBOOK_TOOL_MESSAGES, "tools": COOKBOOK_TOOLS}
        assert echo.inspect(body).prompt_tokens == 101

    def test_it_lists_the_message_count_and_roles_in_order(self, echo):
        report = echo.inspect({"model": "gpt-4o", "messages": AGENT})
        assert report.messages == 6
        assert report.roles == ("system", "user", "assistant", "tool", "tool", "user")

    def test_it_names_each_tool_call_and_whether_its_result_arrived(self, echo):
        messages = AGENT[:4] + AGENT[5:]  # call_2's result is missing
        calls = echo.inspect({"model": "gpt-4o", "messages": messages}).tool_calls
        assert [(c.id, c.name, c.answered) for c in calls] == [
            ("call_1", "run_tests", True),
            ("call_2", "read_file", False),
        ]
        assert calls[0].result_tokens > 0 and calls[1].result_tokens == 0

    def test_a_complete_conversation_is_valid(self, echo):
        report = echo.inspect({"model": "gpt-4o", "messages": AGENT})
        assert report.valid and report.problems == ()

    def test_a_tool_result_without_its_call_makes_the_conversation_invalid(self, echo):
        messages = [AGENT[0], AGENT[1], AGENT[3], AGENT[5]]
        report = echo.inspect({"model": "gpt-4o", "messages": messages})
        assert not report.valid and "has no preceding call" in report.problems[0]

    def test_a_call_without_its_results_makes_the_conversation_invalid(self, echo):
        report = echo.inspect({"model": "gpt-4o", "messages": [*AGENT[:3], AGENT[5]]})
        assert not report.valid and "have no results" in report.problems[0]

    def test_a_model_of_another_family_is_counted_with_its_estimate_and_says_so(self, echo):
        report = echo.inspect({"model": "claude-3-5-sonnet", "messages": AGENT})
        assert not report.exact and report.tokenizer == "cl100k_base+bound:claude"
        assert "an estimate" in report.text()

    def test_its_text_states_the_counts_the_calls_and_the_validity(self, echo):
        text = echo.inspect({"model": "gpt-4o", "messages": AGENT}).text()
        assert "no model was called" in text and "6 messages reached me" in text
        assert "run_tests (call_1) with its result" in text and "The conversation is valid." in text


class TestChatCompletions:
    async def test_it_answers_with_its_report_and_a_usage_that_adds_up(self, client, echo):
        body = {"model": "gpt-4o", "messages": AGENT}
        response = await client.post("/v1/chat/completions", json=body)
        data = await response.json()
        assert response.status == 200 and data["object"] == "chat.completion"
        assert data["echo"]["messages"] == 6 and data["echo"]["valid"] and data["echo"]["tokenizer"] == "o200k_base"
        assert [c["name"] for c in data["echo"]["tool_calls"]] == ["run_tests", "read_file"]
        assert data["choices"][0]["message"]["content"] == echo.inspect(body).text()
        usage = data["usage"]
        assert usage["prompt_tokens"] == data["echo"]["prompt_tokens"]
        assert usage["completion_tokens"] > 0
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]

    async def test_it_answers_on_the_path_without_v1_too(self, client):
        response = await client.post("/chat/completions", json={"model": "gpt-4o", "messages": AGENT})
        assert response.status == 200

    async def test_a_stream_is_sse_chunks_ending_in_done_that_spell_the_same_reply(self, client, echo):
        body = {"model": "gpt-4o", "messages": AGENT, "stream": True}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.headers["Content-Type"].startswith("text/event-stream")
        events = [line[6:] for line in (await response.text()).splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert all(c["object"] == "chat.completion.chunk" for c in chunks)
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == echo.inspect(body).text()
        assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["echo"]["valid"]
        assert not any("usage" in c for c in chunks)

    async def test_a_stream_that_asks_for_usage_ends_with_a_usage_chunk(self, client):
        body = {"model": "gpt-4o", "messages": AGENT, "stream": True, "stream_options": {"include_usage": True}}
        response = await client.post("/v1/chat/completions", json=body)
        events = [line[6:] for line in (await response.text()).splitlines() if line.startswith("data: ")]
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["prompt_tokens"] > 0
        assert all(c["usage"] is None for c in chunks[:-1])

    async def test_the_openai_sdk_reads_its_stream_usage_and_report(self, client):
        sdk = AsyncOpenAI(base_url=str(client.make_url("/v1")), api_key="none", max_retries=0)
        async with sdk:
            stream = await sdk.chat.completions.create(
                model="gpt-4o", messages=AGENT, stream=True, stream_options={"include_usage": True}
            )
            chunks = [chunk async for chunk in stream]
        assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
        reports = [c.model_extra["echo"] for c in chunks if c.model_extra and "echo" in c.model_extra]
        assert len(reports) == 1 and reports[0]["messages"] == 6

    async def test_invalid_json_gets_an_openai_shaped_400(self, client):
        response = await client.post("/v1/chat/completions", data=b"{not json")
        error = (await response.json())["error"]
        assert response.status == 400 and error["type"] == "invalid_request_error"
        assert "not valid JSON" in error["message"]

    async def test_a_body_without_messages_gets_a_400_naming_the_field(self, client):
        response = await client.post("/v1/chat/completions", json={"model": "gpt-4o"})
        assert response.status == 400 and (await response.json())["error"]["param"] == "messages"

    async def test_a_body_without_a_model_gets_a_400_naming_the_field(self, client):
        response = await client.post("/v1/chat/completions", json={"messages": AGENT})
        assert response.status == 400 and (await response.json())["error"]["param"] == "model"

    async def test_a_body_over_the_limit_gets_an_openai_shaped_413(self, client):
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x" * 8000}]}
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status == 413 and "limit" in (await response.json())["error"]["message"]


class TestOtherPaths:
    async def test_models_lists_the_configured_ids(self, client):
        data = await (await client.get("/v1/models")).json()
        assert data["object"] == "list" and [m["id"] for m in data["data"]] == ["echo", "small-local"]

    async def test_any_model_id_can_be_retrieved(self, client):
        data = await (await client.get("/v1/models/gpt-4o")).json()
        assert data == {"id": "gpt-4o", "object": "model", "created": 0, "owned_by": "context-guard-echo"}

    async def test_an_unknown_path_gets_an_openai_shaped_404_listing_what_it_serves(self, client):
        response = await client.post("/v1/embeddings", json={})
        error = (await response.json())["error"]
        assert response.status == 404 and error["code"] == "unknown_url" and "/v1/chat/completions" in error["message"]

    async def test_a_wrong_method_gets_an_openai_shaped_405(self, client):
        response = await client.get("/v1/chat/completions")
        assert response.status == 405 and "use POST" in (await response.json())["error"]["message"]


class TestRunningEcho:
    async def test_it_serves_on_a_free_loopback_port_and_frees_it_on_exit(self):
        async with running_echo() as url:
            port = int(url.rsplit(":", 1)[1].split("/")[0])
            assert url == f"http://127.0.0.1:{port}/v1" and not refuses_connections(port)
        assert refuses_connections(port)


class TestEchoInThread:
    def test_it_serves_from_its_own_thread_and_stops_it_on_exit(self):
        with echo_in_thread() as url:
            port = int(url.rsplit(":", 1)[1].split("/")[0])

            async def ask() -> int:
                sdk = AsyncOpenAI(base_url=url, api_key="none", max_retries=0)
                async with sdk:
                    completion = await sdk.chat.completions.create(model="gpt-4o", messages=AGENT)
                return int(completion.model_extra["echo"]["messages"])

            assert asyncio.run(ask()) == 6
        assert refuses_connections(port)
        assert not any(t.name == "echo-upstream" for t in threading.enumerate())
