"""The built-in echo upstream: what it reports, how it answers (JSON, SSE, errors), how it runs."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from typing import Any

import pytest
from openai import AsyncOpenAI

from proxy.demo.echo import EchoSettings, EchoUpstream, echo_in_thread, running_echo
from tests.support.cookbook import COOKBOOK_MESSAGES, COOKBOOK_TOOL_MESSAGES, COOKBOOK_TOOLS


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

    async def test_it_answers_on_azure_s_deployment_path_as_the_guard_forwards_it(self, client):
        """`serve --upstream echo` behind the AzureOpenAI client (examples/sdk_azure.py)."""
        path = "/v1/openai/deployments/prod-gpt4o/chat/completions?api-version=2024-10-21"
        response = await client.post(path, json={"model": "prod-gpt4o", "messages": AGENT})
        assert response.status == 200 and (await response.json())["echo"]["model"] == "prod-gpt4o"

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
        response = await client.post("/v1/audio/speech", json={})
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


class TestEveryApiShape:
    """Each API the guard serves, answered by the echo in its own shape and read by its own SDK."""

    @pytest.fixture
    async def url(self, aiohttp_server: Any) -> str:
        server = await aiohttp_server(EchoUpstream().app())
        return str(server.make_url("/v1"))

    async def test_responses_answers_whole_with_its_report_and_usage(self, url):
        client = AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        response = await client.responses.create(model="gpt-4o", input="Hello", instructions="Be brief.")
        echo = response.model_extra["echo"]
        assert response.status == "completed" and response.output_text.startswith("Echo from context-guard")
        assert echo["roles"] == ["system", "user"] and response.usage.input_tokens == echo["prompt_tokens"]

    async def test_responses_streams_its_event_sequence_to_a_completed_response(self, url):
        client = AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        async with client.responses.stream(model="gpt-4o", input="Hello") as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
        assert kinds[:4] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        assert "response.output_text.delta" in kinds and kinds[-1] == "response.completed"
        assert final.output_text.startswith("Echo from context-guard") and final.usage.output_tokens > 0

    async def test_a_responses_tool_output_is_seen_with_its_call(self, url):
        client = AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        items = [
            {"role": "user", "content": "Run the tests."},
            {"type": "function_call", "call_id": "call_1", "name": "run_tests", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "240 passed"},
        ]
        response = await client.responses.create(model="gpt-4o", input=items)
        calls = response.model_extra["echo"]["tool_calls"]
        assert [(c["id"], c["name"], c["answered"]) for c in calls] == [("call_1", "run_tests", True)]

    async def test_legacy_completions_answer_whole_and_streamed(self, url):
        client = AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        whole = await client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Say hi")
        stream = await client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Say hi", stream=True)
        streamed = "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])
        assert whole.choices[0].text == streamed and whole.usage.prompt_tokens > 0

    async def test_embeddings_are_one_deterministic_vector_per_input(self, url):
        client = AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        first = await client.embeddings.create(model="text-embedding-3-small", input=["a", "b"])
        again = await client.embeddings.create(model="text-embedding-3-small", input="a", encoding_format="float")
        assert len(first.data) == 2 and first.data[0].embedding == pytest.approx(again.data[0].embedding, abs=1e-5)
        assert first.data[0].embedding != first.data[1].embedding

    async def test_anthropic_messages_answer_whole_and_streamed(self, url):
        from anthropic import AsyncAnthropic

        client = AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key="x", max_retries=0)
        args = {"model": "claude-sonnet-4-6", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
        whole = await client.messages.create(**args)
        async with client.messages.stream(**args) as stream:
            final = await stream.get_final_message()
        assert whole.content[0].text == final.content[0].text and final.stop_reason == "end_turn"
        assert final.usage.input_tokens == whole.usage.input_tokens > 0

    async def test_anthropic_errors_take_anthropic_s_shape(self, url):
        from anthropic import AsyncAnthropic, BadRequestError

        client = AsyncAnthropic(base_url=url.removesuffix("/v1"), api_key="x", max_retries=0)
        with pytest.raises(BadRequestError) as caught:
            await client.messages.create(model="claude-sonnet-4-6", max_tokens=64, messages="not a list")  # type: ignore[arg-type]
        assert caught.value.body["type"] == "error" and caught.value.body["error"]["type"] == "invalid_request_error"


class TestBehindTheGuard:
    """`--upstream echo` as the Agents SDK and the anthropic SDK meet it: the guard in front of the echo."""

    @pytest.fixture
    async def guard_url(self, start_proxy: Any) -> Any:
        from proxy.config.settings import settings_from_dict
        from proxy.demo.echo import with_echo_upstream

        async with running_echo() as echo_url:
            settings = with_echo_upstream(settings_from_dict({}, "<test>", {}), echo_url)
            proxy = await start_proxy(settings)
            yield str(proxy.make_url("/v1"))

    async def test_the_agents_sdk_runs_and_streams_through_it(self, guard_url, monkeypatch):
        monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
        from agents import Agent, OpenAIResponsesModel, Runner

        model = OpenAIResponsesModel("gpt-4o-mini", AsyncOpenAI(base_url=guard_url, api_key="x", max_retries=0))
        agent = Agent(name="echo", instructions="Be brief.", model=model)
        result = await Runner.run(agent, input="Hello")
        streamed = Runner.run_streamed(agent, input="Hello again")
        async for _ in streamed.stream_events():
            pass
        assert result.final_output.startswith("Echo from context-guard") and "2 messages" in result.final_output
        assert streamed.final_output.startswith("Echo from context-guard")

    async def test_the_anthropic_sdk_streams_through_it(self, guard_url):
        from anthropic import AsyncAnthropic

        client = AsyncAnthropic(base_url=guard_url.removesuffix("/v1"), api_key="x", max_retries=0)
        args = {"model": "claude-sonnet-4-6", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}]}
        async with client.messages.stream(**args) as stream:
            final = await stream.get_final_message()
        assert final.content[0].text.startswith("Echo from context-guard") and final.stop_reason == "end_turn"


class TestGeminiPaths:
    """The echo answers Gemini's paths as Gemini does, and google-genai reads it through the guard."""

    BODY: dict[str, Any] = {  # noqa: RUF012
        "systemInstruction": {"parts": [{"text": "Be brief."}]},
        "contents": [{"role": "user", "parts": [{"text": "Hello"}]}],
    }

    async def test_a_whole_answer_reports_what_arrived(self, client):
        response = await client.post("/v1beta/models/gemini-2.5-flash:generateContent", json=self.BODY)
        answer = await response.json()
        assert answer["candidates"][0]["content"]["parts"][0]["text"].startswith("Echo from context-guard")
        assert answer["echo"]["roles"] == ["system", "user"] and answer["usageMetadata"]["promptTokenCount"] > 0

    async def test_a_stream_is_server_sent_events_with_alt_sse_and_a_json_array_without(self, client):
        path = "/v1beta1/projects/p/locations/global/publishers/google/models/gemini-2.5-pro:streamGenerateContent"
        sse = await (await client.post(path + "?alt=sse", json=self.BODY)).text()
        pieces = [json.loads(line[6:]) for line in sse.splitlines() if line.startswith("data: ")]
        array = json.loads(await (await client.post(path, json=self.BODY)).text())
        assert len(pieces) == len(array) > 1 and pieces[-1]["candidates"][0]["finishReason"] == "STOP"

    async def test_count_tokens_and_errors_take_google_s_shape(self, client):
        counted = await (await client.post("/v1/models/gemini-2.5-flash:countTokens", json=self.BODY)).json()
        refused = await client.post("/v1/models/gemini-2.5-flash:generateContent", json={"contents": "hi"})
        assert counted["totalTokens"] > 0
        assert refused.status == 400 and (await refused.json())["error"]["status"] == "INVALID_ARGUMENT"

    async def test_google_genai_reads_it_through_the_guard(self, start_proxy):
        from google import genai
        from google.genai import types

        from proxy.config.settings import settings_from_dict
        from proxy.demo.echo import with_echo_upstream

        async with running_echo() as echo_url:
            proxy = await start_proxy(with_echo_upstream(settings_from_dict({}, "<test>", {}), echo_url))
            options = types.HttpOptions(base_url=str(proxy.make_url("")).rstrip("/"))
            google = genai.Client(api_key="no-key-needed", http_options=options)
            reply = await google.aio.models.generate_content(model="gemini-2.5-flash", contents="Hello")
            stream = await google.aio.models.generate_content_stream(model="gemini-2.5-flash", contents="Hello")
            streamed = "".join([chunk.text or "" async for chunk in stream])
        assert (
            reply.text is not None and reply.text.startswith("Echo from context-guard") and "1 messages" in reply.text
        )
        assert streamed.startswith("Echo from context-guard")


class TestInteractionsPath:
    """The echo answers Google's Interactions API as Google does, whole and streamed, and google-genai reads it."""

    BODY: dict[str, Any] = {"model": "gemini-2.5-flash", "input": "Hello", "system_instruction": "Be brief."}  # noqa: RUF012

    async def test_a_whole_interaction_reports_what_arrived(self, client):
        answer = await (await client.post("/v1beta/interactions", json=self.BODY)).json()
        assert answer["status"] == "completed" and answer["echo"]["roles"] == ["system", "user"]
        assert answer["steps"][0]["content"][0]["text"].startswith("Echo from context-guard")
        assert answer["usage"]["total_input_tokens"] > 0

    async def test_a_stream_is_named_events_ending_with_the_completed_interaction(self, client):
        text = await (await client.post("/v1/interactions", json={**self.BODY, "stream": True})).text()
        names = [line[7:] for line in text.splitlines() if line.startswith("event: ")]
        assert names[0] == "interaction.created" and names[-1] == "interaction.completed" and "step.delta" in names

    async def test_errors_take_the_interactions_shape(self, client):
        refused = await client.post("/v1/interactions", json={"model": "gemini-2.5-flash", "input": 7})
        assert refused.status == 400 and (await refused.json())["error"]["code"] == "invalid_request"

    async def test_google_genai_reads_it_through_the_guard(self, start_proxy):
        from google import genai
        from google.genai import types

        from proxy.config.settings import settings_from_dict
        from proxy.demo.echo import with_echo_upstream

        async with running_echo() as echo_url:
            proxy = await start_proxy(with_echo_upstream(settings_from_dict({}, "<test>", {}), echo_url))
            options = types.HttpOptions(base_url=str(proxy.make_url("")).rstrip("/"))
            google = genai.Client(api_key="no-key-needed", http_options=options)
            answer = await google.aio.interactions.create(model="gemini-2.5-flash", input="Hello")
            stream = await google.aio.interactions.create(model="gemini-2.5-flash", input="Hello", stream=True)
            streamed = "".join([e.delta.text async for e in stream if e.event_type == "step.delta"])
        assert answer.output_text.startswith("Echo from context-guard") and streamed.startswith("Echo from context-guard")
