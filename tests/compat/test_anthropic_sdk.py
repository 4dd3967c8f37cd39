"""The anthropic SDK through the guard: the overflow in Anthropic's words, a broken stream that
raises, and tool_use / tool_result pairs across trimmed turns."""

from __future__ import annotations

import re

import anthropic
import pytest
from anthropic import Anthropic

from proxy.demo.provider_answers import ToolCall
from tests.compat.conftest import CLAUDE_MODEL, WINDOW, Servers
from tests.compat.conversations import HUGE, anthropic_history, anthropic_pairs_intact, tokens


def client(guard: Servers) -> Anthropic:
    return Anthropic(base_url=guard.root, api_key="sk-ant-compat", max_retries=0)


class TestAnthropicSdk:
    def test_an_overflow_is_a_bad_request_saying_the_prompt_is_too_long(self, guard):
        with pytest.raises(anthropic.BadRequestError) as caught:
            client(guard).messages.create(
                model=CLAUDE_MODEL, max_tokens=256, system=HUGE, messages=[{"role": "user", "content": "hi"}]
            )
        error = caught.value.body["error"]
        assert error["type"] == "invalid_request_error" and error["message"].startswith("prompt is too long: ")
        assert " maximum." in error["message"] and "input budget" in error["message"]
        assert not guard.upstream.received

    def test_input_and_max_tokens_over_the_window_are_refused_in_anthropics_words_and_the_retry_goes(self, guard):
        """Anthropic's sentence for input + `max_tokens` over the window: Claude Code reads the numbers
        with this very pattern and sends again with `max_tokens` = limit - input - 1000."""
        system, messages = "word " * 1800, [{"role": "user", "content": "hi"}]
        with pytest.raises(anthropic.BadRequestError) as caught:
            client(guard).messages.create(model=CLAUDE_MODEL, max_tokens=2000, system=system, messages=messages)
        error = caught.value.body["error"]
        assert error["type"] == "invalid_request_error" and not guard.upstream.received
        found = re.search(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+)", error["message"])
        assert found is not None and error["message"].startswith(found.group(0))
        prompt, asked, limit = map(int, found.groups())
        assert asked == 2000 and prompt < limit < WINDOW and prompt + asked > limit
        retried = limit - prompt - 1000
        reply = client(guard).messages.create(model=CLAUDE_MODEL, max_tokens=retried, system=system, messages=messages)
        assert reply.content[0].text == "ok" and guard.upstream.last.body["max_tokens"] == retried
        assert guard.upstream.last.body["system"] == system  # forwarded as it came: it fits

    def test_a_stream_broken_mid_way_raises_instead_of_passing_for_a_finished_answer(self, guard):
        guard.upstream.script.append("one two three four five six")
        guard.upstream.break_after = 4
        with pytest.raises(anthropic.APIStatusError, match="ended the stream early"):
            with client(guard).messages.stream(
                model=CLAUDE_MODEL, max_tokens=256, messages=[{"role": "user", "content": "hi"}]
            ) as stream:
                stream.get_final_message()
        line = guard.last_log()
        assert (line["outcome"], line["status"], line["guard_outcome"]) == ("stream_broken", 502, "unchanged")

    def test_tool_use_across_trimmed_turns_arrives_paired_and_within_the_window(self, guard):
        sent = anthropic_history()
        guard.upstream.script.append(ToolCall("get_weather", '{"city": "Lyon"}'))
        tools = [
            {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
        ]
        reply = client(guard).messages.create(model=CLAUDE_MODEL, max_tokens=256, messages=sent, tools=tools)
        arrived = guard.upstream.last.body["messages"]
        assert reply.stop_reason == "tool_use" and reply.content[0].input == {"city": "Lyon"}
        assert len(arrived) < len(sent) and arrived[0]["role"] == "user" and anthropic_pairs_intact(arrived)
        assert any(isinstance(m["content"], list) for m in arrived) and tokens(arrived) < WINDOW

    def test_a_streamed_tool_use_is_assembled_by_the_sdk(self, guard):
        guard.upstream.script.append(ToolCall("get_weather", '{"city": "Lyon"}'))
        with client(guard).messages.stream(model=CLAUDE_MODEL, max_tokens=256, messages=anthropic_history()) as stream:
            final = stream.get_final_message()
        assert final.stop_reason == "tool_use" and final.content[0].input == {"city": "Lyon"}

    def test_count_tokens_is_answered_by_the_guard(self, guard):
        counted = client(guard).messages.count_tokens(model=CLAUDE_MODEL, messages=anthropic_history())
        assert counted.input_tokens > WINDOW and not guard.upstream.received
