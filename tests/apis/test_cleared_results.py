"""A tool result cleared, or an old exchange dropped, written back in each API's own shape: the
placeholder as the unit's content, reasoning and thinking kept or dropped with their call."""

from __future__ import annotations

from typing import Any

from proxy.apis.anthropic.messages import MessagesAdapter
from proxy.apis.gemini.generate_content import GenerateContentAdapter
from proxy.apis.openai.responses import ResponsesAdapter
from tests.apis.fitting import fit_body, words
from tests.support.validity import messages_problems, responses_problems


def responses_loop(steps: int, result_words: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": "Read the files."}]
    for k in range(steps):
        items.append({"type": "reasoning", "id": f"rs{k}", "summary": [{"type": "summary_text", "text": f"read {k}"}]})
        items.append({"type": "function_call", "call_id": f"c{k}", "name": "read_file", "arguments": "{}"})
        items.append({"type": "function_call_output", "call_id": f"c{k}", "output": words(result_words, f"w{k}")})
    return items


def anthropic_loop(steps: int, result_words: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Read the files."}]
    for k in range(steps):
        thinking = {"type": "thinking", "thinking": f"read {k}", "signature": f"s{k}"}
        use = {"type": "tool_use", "id": f"c{k}", "name": "read_file", "input": {}}
        messages.append({"role": "assistant", "content": [thinking, use]})
        result = {
            "type": "tool_result",
            "tool_use_id": f"c{k}",
            "content": words(result_words, f"w{k}"),
            "is_error": False,
        }
        messages.append({"role": "user", "content": [result]})
    return messages


class TestResponses:
    def test_a_cleared_output_is_the_placeholder_and_its_call_and_reasoning_stay(self):
        items = responses_loop(12, 500)
        sent = fit_body(ResponsesAdapter(), {"model": "gpt-4o", "input": items}, 8_000).body["input"]
        assert len(sent) == len(items) and responses_problems({"input": sent}) == []
        assert sent[3]["output"].startswith("[context-guard cleared the output of read_file")
        assert sent[1:3] == items[1:3] and sent[-9:] == items[-9:]

    def test_a_dropped_exchange_takes_its_reasoning_with_it(self):
        items = responses_loop(40, 100)
        sent = fit_body(ResponsesAdapter(), {"model": "gpt-4o", "input": items}, 2_000).body["input"]
        assert responses_problems({"input": sent}) == [] and sent[0] == items[0] and sent[-9:] == items[-9:]
        assert all(item["id"] != "rs0" for item in sent if item.get("type") == "reasoning")
        kept_calls = {item["call_id"] for item in sent if item.get("type") == "function_call"}
        reasonings = {item["id"] for item in sent if item.get("type") == "reasoning"}
        assert reasonings == {f"rs{c[1:]}" for c in kept_calls}


class TestAnthropic:
    def test_a_cleared_tool_result_is_the_placeholder_its_other_fields_kept(self):
        messages = anthropic_loop(12, 500)
        body = {"model": "claude-sonnet-4-6", "max_tokens": 500, "messages": messages}
        sent = fit_body(MessagesAdapter(), body, 8_000, model="claude-sonnet-4-6").body["messages"]
        assert len(sent) == len(messages) and messages_problems({"messages": sent}) == []
        first = sent[2]["content"][0]
        assert first["content"].startswith("[context-guard cleared") and first["is_error"] is False
        assert [m["content"] for m in sent if m["role"] == "assistant"] == [
            m["content"] for m in messages if m["role"] == "assistant"
        ]  # every thinking block with its tool_use
        assert sent[-6:] == messages[-6:]

    def test_dropped_exchanges_leave_roles_alternating_and_the_newest_thinking_in_place(self):
        messages = anthropic_loop(40, 100)
        body = {"model": "claude-sonnet-4-6", "max_tokens": 500, "messages": messages}
        sent = fit_body(MessagesAdapter(), body, 2_500, model="claude-sonnet-4-6").body["messages"]
        assert messages_problems({"messages": sent}) == [] and sent[0] == messages[0]
        assert len(sent) < len(messages) and sent[-6:] == messages[-6:]


def gemini_loop(steps: int, result_words: int) -> list[dict[str, Any]]:
    contents: list[dict[str, Any]] = [{"role": "user", "parts": [{"text": "Read the files."}]}]
    for k in range(steps):
        call = {"functionCall": {"id": f"c{k}", "name": "read_file", "args": {"n": k}}, "thoughtSignature": f"sig{k}"}
        contents.append({"role": "model", "parts": [call]})
        answer = {"functionResponse": {"id": f"c{k}", "name": "read_file", "response": {"output": words(result_words, f"w{k}")}}}
        contents.append({"role": "user", "parts": [answer]})
    return contents


class TestGemini:
    def test_a_cleared_function_response_is_the_placeholder_its_call_and_signature_untouched(self):
        contents = gemini_loop(12, 500)
        body = {"contents": contents, "generationConfig": {"maxOutputTokens": 500}}
        sent = fit_body(GenerateContentAdapter(), body, 8_000, model="gemini-2.5-flash").body["contents"]
        assert len(sent) == len(contents) and sent[0] == contents[0]
        first = sent[2]["parts"][0]["functionResponse"]
        assert first["id"] == "c0" and first["name"] == "read_file"
        assert first["response"]["output"].startswith("[context-guard cleared the output of read_file")
        assert [c for c in sent if c["role"] == "model"] == [c for c in contents if c["role"] == "model"]
        assert sent[-6:] == contents[-6:]  # the newest three exchanges verbatim

    def test_dropped_exchanges_go_whole_and_the_opening_prompt_stays(self):
        contents = gemini_loop(40, 100)
        body = {"contents": contents, "generationConfig": {"maxOutputTokens": 500}}
        sent = fit_body(GenerateContentAdapter(), body, 2_500, model="gemini-2.5-flash").body["contents"]
        assert sent[0] == contents[0] and len(sent) < len(contents) and sent[-6:] == contents[-6:]
        calls = [p["functionCall"]["id"] for c in sent if c["role"] == "model" for p in c["parts"]]
        answers = [p["functionResponse"]["id"] for c in sent[1:] if c["role"] == "user" for p in c["parts"]]
        assert calls == answers  # every call kept has its response, and none is left without its call
        assert [c["role"] for c in sent] == ["user", *(["model", "user"] * len(calls))]
