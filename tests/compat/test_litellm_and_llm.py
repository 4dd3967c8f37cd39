"""litellm as a client and the `llm` CLI through the guard: litellm's own exception mapping sees the
guard's overflow as a ContextWindowExceededError (so its context_window_fallbacks fire), for the
OpenAI and the Anthropic shape; the `llm` CLI, configured to the guard as an OpenAI-compatible
model in a temporary LLM_USER_PATH, reports the overflow and a broken stream and runs a tool loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.demo.provider_answers import ToolCall
from tests.compat.conftest import CHAT_MODEL, CLAUDE_MODEL, WINDOW, Servers
from tests.compat.conversations import (
    HUGE,
    OVERFLOW,
    chat_history,
    chat_pairs_intact,
    tokens,
)


class TestLiteLLM:
    def complete(self, guard: Servers, **args):
        import litellm

        base = {"model": f"openai/{CHAT_MODEL}", "api_base": guard.v1, "api_key": "sk-compat", "num_retries": 0}
        return litellm.completion(**{**base, **args})

    def test_an_openai_shaped_overflow_is_a_context_window_exceeded_error(self, guard):
        import litellm

        with pytest.raises(litellm.ContextWindowExceededError):
            self.complete(guard, messages=OVERFLOW)

    def test_an_anthropic_shaped_overflow_is_a_context_window_exceeded_error(self, guard):
        import litellm

        with pytest.raises(litellm.ContextWindowExceededError):
            litellm.completion(
                model=f"anthropic/{CLAUDE_MODEL}",
                api_base=f"{guard.root}/v1/messages",
                api_key="sk-ant-compat",
                max_tokens=256,
                messages=OVERFLOW,
                num_retries=0,
            )
        assert guard.last_log()["kind"] == "messages"

    def test_tool_calls_across_trimmed_turns_arrive_paired(self, guard):
        guard.upstream.script.append(ToolCall("get_weather", '{"city": "Lyon"}'))
        sent = chat_history()
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        reply = self.complete(guard, messages=sent, tools=tools)
        arrived = guard.upstream.last.body["messages"]
        assert json.loads(reply.choices[0].message.tool_calls[0].function.arguments) == {"city": "Lyon"}
        assert len(arrived) < len(sent) and chat_pairs_intact(arrived) and tokens(arrived) < WINDOW

    def test_a_stream_broken_mid_way_raises(self, guard):
        guard.upstream.script.append("one two three four five six")
        guard.upstream.break_after = 3
        with pytest.raises(Exception, match="ended the stream early"):
            for _ in self.complete(guard, messages=[{"role": "user", "content": "hi"}], stream=True):
                pass


class TestLlmCli:
    @pytest.fixture
    def llm(self, guard: Servers, tmp_path: Path):
        config = f"- model_id: guarded\n  model_name: {CHAT_MODEL}\n  api_base: {guard.v1}\n  supports_tools: true\n"
        (tmp_path / "extra-openai-models.yaml").write_text(config)
        env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "sk-compat"}
        executable = str(Path(sys.executable).parent / "llm")

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [executable, "-m", "guarded", *args], env=env, capture_output=True, text=True, timeout=120
            )

        return run

    def test_a_prompt_is_answered_through_the_guard(self, guard, llm):
        guard.upstream.script.append("hello from upstream")
        done = llm("Say hello")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "hello from upstream" and guard.upstream.last.body["model"] == CHAT_MODEL

    def test_an_overflow_is_reported_in_openai_s_words(self, guard, llm):
        done = llm("-s", HUGE, "hi")
        assert done.returncode != 0 and "maximum context length is" in done.stderr
        assert not guard.upstream.received

    def test_a_stream_broken_mid_way_is_an_error(self, guard, llm):
        guard.upstream.script.append("one two three four five six")
        guard.upstream.break_after = 3
        done = llm("hi")
        assert done.returncode != 0 and "ended the stream early" in done.stderr

    def test_a_tool_whose_result_cannot_fit_is_cut_and_stays_paired(self, guard, llm):
        guard.upstream.script += [ToolCall("weather", '{"city": "Lyon"}'), "tomorrow is sunny"]
        tool = 'def weather(city: str) -> str:\n    "The weather in a city."\n    return "sunny and mild " * 3000\n'
        done = llm("--functions", tool, "What is the weather in Lyon?")
        second = guard.upstream.last.body["messages"]
        assert done.returncode == 0, done.stderr
        assert "tomorrow is sunny" in done.stdout and len(guard.upstream.received) == 2
        assert any(m["role"] == "tool" for m in second) and chat_pairs_intact(second) and tokens(second) < WINDOW
