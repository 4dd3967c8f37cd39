"""Agent frameworks and wrappers through the guard: the OpenAI Agents SDK, pydantic-ai,
langchain-openai and instructor, each with its own classification of the guard's overflow, its
stream parsing through a break, and tools across trimmed turns."""

from __future__ import annotations

import asyncio

import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from pydantic import BaseModel

from proxy.demo.provider_answers import ToolCall
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

BIG_RESULT = "sunny and mild with a light breeze from the west " * 600  # about 6,000 tokens


def weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: {BIG_RESULT}"


class TestOpenAIAgents:
    def agent(self, guard: Servers, instructions: str = "You answer about the weather."):
        from agents import Agent, OpenAIResponsesModel, function_tool

        model = OpenAIResponsesModel(CHAT_MODEL, AsyncOpenAI(base_url=guard.v1, api_key="sk-compat", max_retries=0))
        return Agent(name="weather", instructions=instructions, model=model, tools=[function_tool(weather)])

    def test_a_tool_loop_over_a_long_history_arrives_trimmed_and_paired(self, guard):
        from agents import Runner

        guard.upstream.script += [ToolCall("weather", '{"city": "Lyon"}'), "tomorrow is sunny"]
        sent = responses_history()
        result = asyncio.run(Runner.run(self.agent(guard), input=sent))
        second = guard.upstream.last.body["input"]
        assert result.final_output == "tomorrow is sunny" and len(guard.upstream.received) == 2
        assert any(i.get("type") == "function_call_output" for i in second) and responses_pairs_intact(second)
        assert len(second) < len(sent) and tokens(second) < WINDOW

    def test_an_overflow_raises_openai_s_bad_request_with_its_code(self, guard):
        from agents import Runner

        with pytest.raises(openai.BadRequestError) as caught:
            asyncio.run(Runner.run(self.agent(guard, instructions=HUGE), input="hi"))
        assert caught.value.code == "context_length_exceeded"

    def test_a_stream_broken_mid_way_raises(self, guard):
        from agents import Runner

        guard.upstream.script.append("one two three four five six")
        guard.upstream.break_after = 4

        async def run() -> None:
            streamed = Runner.run_streamed(self.agent(guard), input="hi")
            async for _ in streamed.stream_events():
                pass

        with pytest.raises(openai.APIError, match="ended the stream early"):
            asyncio.run(run())


class TestPydanticAI:
    def agent(self, guard: Servers, system_prompt: str = "You answer about the weather."):
        from pydantic_ai import Agent
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider

        client = AsyncOpenAI(base_url=guard.v1, api_key="sk-compat", max_retries=0)
        model = OpenAIChatModel(CHAT_MODEL, provider=OpenAIProvider(openai_client=client))
        agent = Agent(model, system_prompt=system_prompt)
        agent.tool_plain(weather)
        return agent

    def test_a_tool_result_too_large_for_the_window_is_cut_and_stays_paired(self, guard):
        guard.upstream.script += [ToolCall("weather", '{"city": "Lyon"}'), "tomorrow is sunny"]
        result = self.agent(guard).run_sync("What is the weather in Lyon?")
        second = guard.upstream.last.body["messages"]
        assert result.output == "tomorrow is sunny" and chat_pairs_intact(second)
        assert any(m["role"] == "tool" for m in second) and tokens(second) < WINDOW
        assert guard.last_log(requests=2)["outcome"] == "trimmed"

    def test_an_overflow_is_its_context_window_exceeded_error(self, guard):
        from pydantic_ai.exceptions import ModelContextWindowExceededError

        with pytest.raises(ModelContextWindowExceededError):
            self.agent(guard, system_prompt=HUGE).run_sync("hi")

    def test_a_stream_broken_mid_way_raises(self, guard):
        guard.upstream.script.append("one two three four five six")
        guard.upstream.break_after = 3

        async def run() -> None:
            async with self.agent(guard).run_stream("hi") as streamed:
                async for _ in streamed.stream_text():
                    pass

        with pytest.raises(Exception, match="ended the stream early"):
            asyncio.run(run())


class TestLangChainOpenAI:
    def model(self, guard: Servers):
        from langchain_openai import ChatOpenAI

        return ChatOpenAI(model=CHAT_MODEL, base_url=guard.v1, api_key="sk-compat", max_retries=0)

    def test_tool_calls_across_trimmed_turns_arrive_paired(self, guard):
        guard.upstream.script.append(ToolCall("weather", '{"city": "Lyon"}'))
        sent = chat_history()
        reply = self.model(guard).bind_tools([weather]).invoke(sent)
        arrived = guard.upstream.last.body["messages"]
        assert reply.tool_calls[0]["args"] == {"city": "Lyon"}
        assert len(arrived) < len(sent) and chat_pairs_intact(arrived) and tokens(arrived) < WINDOW

    def test_an_overflow_is_its_context_overflow_error(self, guard):
        from langchain_core.exceptions import ContextOverflowError

        with pytest.raises(ContextOverflowError):
            self.model(guard).invoke(OVERFLOW)

    def test_a_stream_broken_mid_way_raises(self, guard):
        guard.upstream.script.append("one two three four five six")
        guard.upstream.break_after = 3
        with pytest.raises(openai.APIError, match="ended the stream early"):
            for _ in self.model(guard).stream("hi"):
                pass


class Weather(BaseModel):
    city: str
    celsius: int


class TestInstructor:
    def client(self, guard: Servers):
        import instructor

        return instructor.from_openai(OpenAI(base_url=guard.v1, api_key="sk-compat", max_retries=0))

    def test_a_structured_answer_over_a_trimmed_history_is_parsed(self, guard):
        guard.upstream.forced_arguments = '{"city": "Lyon", "celsius": 21}'
        sent = chat_history()
        answer = self.client(guard).chat.completions.create(
            model=CHAT_MODEL, response_model=Weather, messages=sent, max_retries=0
        )
        arrived = guard.upstream.last.body["messages"]
        assert answer.model_dump() == {"city": "Lyon", "celsius": 21}
        assert len(arrived) < len(sent) and chat_pairs_intact(arrived)

    def test_an_overflow_reaches_the_caller_as_openai_s_bad_request(self, guard):
        with pytest.raises(Exception) as caught:
            self.client(guard).chat.completions.create(
                model=CHAT_MODEL, response_model=Weather, messages=OVERFLOW, max_retries=0
            )
        cause = caught.value
        while not isinstance(cause, openai.BadRequestError) and cause.__cause__ is not None:
            cause = cause.__cause__
        assert isinstance(cause, openai.BadRequestError) and cause.code == "context_length_exceeded"

    def test_a_partial_stream_broken_mid_way_raises(self, guard):
        guard.upstream.forced_arguments = '{"city": "Lyon", "celsius": 21}'
        guard.upstream.break_after = 2
        with pytest.raises(Exception, match="ended the stream early"):
            for _ in self.client(guard).chat.completions.create_partial(
                model=CHAT_MODEL, response_model=Weather, messages=[{"role": "user", "content": "hi"}], max_retries=0
            ):
                pass
