"""The openai SDK through the guard: chat, Responses (with previous_response_id), legacy completions,
embeddings and the Azure client, each reading the guard's overflow, a broken stream and trimmed tools."""

from __future__ import annotations

import openai
import pytest
from openai import AzureOpenAI, OpenAI

from tests.compat.conftest import CHAT_MODEL, WINDOW, Servers
from tests.compat.conversations import (
    HUGE,
    OVERFLOW,
    chat_history,
    chat_pairs_intact,
    responses_history,
    responses_pairs_intact,
    tokens,
)


def client(guard: Servers) -> OpenAI:
    return OpenAI(base_url=guard.v1, api_key="sk-compat", max_retries=0)


class TestChatCompletions:
    def test_an_overflow_is_a_bad_request_with_openai_s_code_and_wording(self, guard):
        with pytest.raises(openai.BadRequestError) as caught:
            client(guard).chat.completions.create(model=CHAT_MODEL, messages=OVERFLOW)
        assert caught.value.code == "context_length_exceeded" and caught.value.param == "messages"
        assert caught.value.message.startswith("Error code: 400") or "maximum context length is" in caught.value.message
        assert caught.value.body["message"].startswith(f"This model's maximum context length is {WINDOW} tokens.")
        assert "input budget" in caught.value.body["message"] and not guard.upstream.received

    def test_a_stream_broken_mid_way_raises_and_is_logged_as_broken(self, guard):
        guard.upstream.break_after = 3
        stream = client(guard).chat.completions.create(
            model=CHAT_MODEL, messages=[{"role": "user", "content": "hi"}], stream=True
        )
        guard.upstream.script.append("one two three four five six")
        with pytest.raises(openai.APIError, match="ended the stream early"):
            for _ in stream:
                pass
        line = guard.last_log()
        assert (line["outcome"], line["status"], line["error"]) == ("stream_broken", 502, "upstream_stream_broken")

    def test_tool_calls_across_trimmed_turns_arrive_paired_and_within_the_window(self, guard):
        guard.upstream.script.append("tomorrow is sunny")
        sent = chat_history()
        reply = client(guard).chat.completions.create(model=CHAT_MODEL, messages=sent)
        arrived = guard.upstream.last.body["messages"]
        assert reply.choices[0].message.content == "tomorrow is sunny"
        assert len(arrived) < len(sent) and arrived[-1] == sent[-1] and chat_pairs_intact(arrived)
        assert any(m.get("tool_calls") for m in arrived) and tokens(arrived) < WINDOW

    def test_a_tool_call_answer_is_parsed_by_the_sdk(self, guard):
        from proxy.demo.provider_answers import ToolCall

        guard.upstream.script.append(ToolCall("get_weather", '{"city": "Lyon"}'))
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        reply = client(guard).chat.completions.create(model=CHAT_MODEL, messages=chat_history(), tools=tools)
        call = reply.choices[0].message.tool_calls[0]
        assert (call.function.name, call.function.arguments) == ("get_weather", '{"city": "Lyon"}')


class TestResponses:
    def test_previous_response_id_and_trimmed_function_calls_arrive_as_sent(self, guard):
        sent = responses_history()
        response = client(guard).responses.create(model=CHAT_MODEL, input=sent, previous_response_id="resp_earlier")
        arrived = guard.upstream.last.body
        assert response.output_text == "ok" and arrived["previous_response_id"] == "resp_earlier"
        assert len(arrived["input"]) < len(sent) and responses_pairs_intact(arrived["input"])
        assert tokens(arrived["input"]) < WINDOW

    def test_an_overflow_is_a_bad_request_with_openai_s_code(self, guard):
        with pytest.raises(openai.BadRequestError) as caught:
            client(guard).responses.create(model=CHAT_MODEL, instructions=HUGE, input="hi")
        assert caught.value.code == "context_length_exceeded"
        assert "maximum context length is" in caught.value.body["message"]

    def test_a_stream_broken_mid_way_raises_and_is_logged_as_broken(self, guard):
        guard.upstream.script.append("one two three four five six")
        guard.upstream.break_after = 4
        with pytest.raises(openai.APIError, match="ended the stream early"):
            with client(guard).responses.stream(model=CHAT_MODEL, input="hi") as stream:
                for _ in stream:
                    pass
        assert guard.last_log()["outcome"] == "stream_broken"


class TestLegacyCompletions:
    def test_gpt_3_5_turbo_instruct_is_held_to_its_documented_4096_token_window(self, guard):
        prompt = "The history of rivers. " * 1500  # about 7,500 tokens: the model map's 8,192 would pass it
        client(guard).completions.create(model="gpt-3.5-turbo-instruct", prompt=prompt, max_tokens=100)
        arrived = guard.upstream.last.body["prompt"]
        line = guard.last_log()
        assert tokens(arrived) < 4096 and line["context_window"] == 4096
        assert line["map_correction"]["entry"] == "gpt-3.5-turbo-instruct"

    def test_a_stream_broken_mid_way_raises(self, guard):
        guard.upstream.script.append("one two three four five six")
        guard.upstream.break_after = 2
        stream = client(guard).completions.create(model="gpt-3.5-turbo-instruct", prompt="hi", stream=True)
        with pytest.raises(openai.APIError):
            for _ in stream:
                pass


class TestEmbeddings:
    def test_embeddings_pass_through_and_decode(self, guard):
        result = client(guard).embeddings.create(model="text-embedding-3-small", input=["a", "b"])
        assert len(result.data) == 2 and result.data[0].embedding == pytest.approx([0.1, 0.2, 0.3])


class TestAzure:
    def azure(self, guard: Servers) -> AzureOpenAI:
        return AzureOpenAI(
            azure_endpoint=guard.root, azure_deployment=CHAT_MODEL, api_version="2024-10-21", api_key="k", max_retries=0
        )

    def test_a_deployment_s_chat_is_trimmed_with_its_tools_paired(self, guard):
        sent = chat_history()
        self.azure(guard).chat.completions.create(model=CHAT_MODEL, messages=sent)
        arrived = guard.upstream.last
        assert "/openai/deployments/" in arrived.path and chat_pairs_intact(arrived.body["messages"])
        assert len(arrived.body["messages"]) < len(sent)

    def test_an_overflow_is_a_bad_request_with_openai_s_code(self, guard):
        with pytest.raises(openai.BadRequestError) as caught:
            self.azure(guard).chat.completions.create(model=CHAT_MODEL, messages=OVERFLOW)
        assert caught.value.code == "context_length_exceeded"
