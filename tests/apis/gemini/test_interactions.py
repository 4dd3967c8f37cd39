"""The Interactions API adapter on plain data: what an interaction's fields become in the chat
view, and how a cut is written back into its `input`."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.apis.base import HeldContext, InvalidRequest
from proxy.apis.gemini.interactions import InteractionsAdapter, interactions_error
from proxy.apis.registry import AdapterRegistry
from proxy.core.trimming.budget import Removal
from proxy.errors import ContextLengthExceeded, HTTPRefusal
from tests.apis.fitting import fit_body, words
from tests.support.cookbook import encoding

ADAPTER = InteractionsAdapter()
CL100K = encoding("gpt-4")  # cl100k_base, from the files litellm ships


def text(kind: str, value: str) -> dict[str, Any]:
    return {"type": kind, "content": [{"type": "text", "text": value}]}


def agent_steps(turns: int) -> list[dict[str, Any]]:
    """`turns` questions and answers, a call and its result in the middle, then the latest question."""
    out: list[dict[str, Any]] = []
    for i in range(turns):
        out.append(text("user_input", f"question {i} " + words(150)))
        if i == turns // 2:
            out.append({"type": "thought", "summary": [{"type": "text", "text": "look it up"}], "signature": "c2ln"})
            out.append({"type": "function_call", "id": "c1", "name": "search", "arguments": {"q": "x"}})
            out.append({"type": "function_result", "call_id": "c1", "result": words(30, "found")})
        out.append(text("model_output", f"answer {i} " + words(150, "ipsum")))
    out.append(text("user_input", "the latest question"))
    return out


def texts_tokens(body: dict[str, Any]) -> int:
    """An independent count: tiktoken over every string of the body's input and system instruction."""

    def strings(value: Any) -> list[str]:
        if isinstance(value, str):
            return [value]
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return []

    return sum(len(CL100K.encode(s)) for s in strings([body.get("input"), body.get("system_instruction")]))


class TestParse:
    def test_the_system_instruction_is_pinned_and_a_text_input_is_the_user_message(self) -> None:
        parsed = ADAPTER.parse({"model": "gemini-2.5-flash", "input": "hi", "system_instruction": "be brief"})
        assert parsed.messages == [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
        assert parsed.model == "gemini-2.5-flash" and parsed.api == "interactions"

    def test_a_list_of_contents_is_one_user_message_part_for_part(self) -> None:
        body = {"model": "gemini-2.5-flash", "input": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        (message,) = ADAPTER.parse(body).messages
        assert message["role"] == "user" and [p["text"] for p in message["content"]] == ["a", "b"]

    def test_consecutive_calls_share_one_assistant_message_with_the_thought_before_them(self) -> None:
        steps = [
            text("user_input", "q"),
            {"type": "thought", "summary": [{"type": "text", "text": "plan"}]},
            {"type": "function_call", "id": "a", "name": "f", "arguments": {}},
            {"type": "function_call", "id": "b", "name": "g", "arguments": {"x": 1}},
            {"type": "function_result", "call_id": "a", "result": "ra"},
            {"type": "function_result", "call_id": "b", "result": {"ok": True}},
        ]
        parsed = ADAPTER.parse({"model": "m", "input": steps})
        _, calls, first, second = parsed.messages
        assert [c["id"] for c in calls["tool_calls"]] == ["a", "b"] and calls["reasoning_content"] == "plan"
        assert first == {"role": "tool", "tool_call_id": "a", "content": "ra"}
        assert second["tool_call_id"] == "b" and second["content"] == '{"ok": true}'
        assert [o.index for o in parsed.sources[1].origins] == [1, 2, 3]

    def test_the_earlier_interaction_and_a_cache_are_held_context_named_by_id(self) -> None:
        body = {"model": "m", "input": "and then?", "previous_interaction_id": "int_7", "cached_content": "cc/1"}
        parsed = ADAPTER.parse(body)
        assert parsed.held == (HeldContext("interaction", "int_7"), HeldContext("cache", "cc/1"))
        assert parsed.server_state and not parsed.read_whole

    def test_hosted_tools_and_unknown_steps_are_counted_as_their_json_and_flagged(self) -> None:
        body = {
            "model": "m",
            "input": [text("user_input", "q"), {"type": "google_search_result", "result": [{"url": "u"}]}],
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}, {"type": "google_search"}],
        }
        parsed = ADAPTER.parse(body)
        function = {"name": "f", "parameters": {"type": "object"}}
        assert parsed.chat["tools"][0] == {"type": "function", "function": function}
        assert parsed.unseen == ("tools[1]: what the google_search tool fetches",) and not parsed.exact

    def test_media_by_uri_are_not_seen_and_by_data_are_priced(self) -> None:
        body = {"model": "m", "input": [{"type": "image", "uri": "gs://b/x.png"}, {"type": "audio", "data": "AAAA"}]}
        parts = ADAPTER.parse(body).messages[0]["content"]
        assert parts[0]["type"] == "file" and parts[1]["type"] == "input_audio"

    def test_the_model_may_be_google_s_resource_name(self) -> None:
        assert ADAPTER.parse({"model": "models/gemini-2.5-flash", "input": "hi"}).model == "gemini-2.5-flash"

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({"input": "hi"}, "model"),
            ({"agent": "deep-research", "input": "hi"}, "agent"),
            ({"model": "m", "input": 7}, "input"),
            ({"model": "m", "input": [{"type": "function_call", "name": "f"}]}, "input[0]"),
            (
                {"model": "m", "input": "hi", "generation_config": {"max_output_tokens": 0}},
                "generation_config.max_output_tokens",
            ),
            ({"model": "m", "input": "hi", "system_instruction": ["a"]}, "system_instruction"),
        ],
    )
    def test_a_malformed_body_is_refused_naming_the_field(self, body: dict[str, Any], param: str) -> None:
        with pytest.raises(InvalidRequest) as refused:
            ADAPTER.parse(body)
        assert refused.value.param == param


class TestRender:
    def test_a_request_that_fits_is_the_body_as_received(self) -> None:
        body = {"model": "gpt-4o", "input": agent_steps(1)}
        fitted = fit_body(ADAPTER, body, 128_000)
        assert fitted.body is fitted.parsed.body

    def test_a_cut_keeps_the_system_instruction_the_latest_input_and_the_call_with_its_result(self) -> None:
        body = {"model": "gpt-4o", "system_instruction": "Be brief.", "input": agent_steps(6), "store": False}
        fitted = fit_body(ADAPTER, body, 2000)
        sent = fitted.body
        assert fitted.plan.result.outcome == "trimmed" and texts_tokens(dict(sent)) <= 2000 - 500
        assert sent["system_instruction"] == "Be brief." and sent["store"] is False
        assert sent["input"][-1] is body["input"][-1]
        kinds = [step["type"] for step in sent["input"]]
        assert kinds.count("function_call") == kinds.count("function_result")

    def test_a_lowered_reserve_is_written_into_the_generation_config(self) -> None:
        body = {"model": "gpt-4o", "input": words(100), "generation_config": {"max_output_tokens": 60_000, "seed": 1}}
        fitted = fit_body(ADAPTER, body, 10_000, pipeline=("clamp_max_tokens",))
        assert fitted.body["generation_config"]["seed"] == 1
        assert fitted.body["generation_config"]["max_output_tokens"] < 10_000

    def test_the_budget_note_is_a_user_input_step_where_the_dropped_steps_were(self) -> None:
        steps = [text("user_input", "old"), text("model_output", "old answer"), text("user_input", "latest")]
        body = {"model": "m", "input": steps}
        parsed = ADAPTER.parse(body)
        latest = parsed.messages[2]
        note = {"role": "system", "content": "[2 earlier messages were removed]"}
        removals = [Removal(i, None, "dropped", 3, "h", "drop_oldest_turns") for i in (0, 1)]
        sent = ADAPTER.render(parsed, {"messages": [note, latest]}, removals, inserted=[0])
        assert sent["input"] == [text("user_input", note["content"]), body["input"][2]]


class TestTheApisOwnLanguage:
    def test_errors_carry_the_api_s_snake_case_code(self) -> None:
        assert interactions_error(404, "gone") == {"error": {"code": "not_found", "message": "gone"}}
        assert ADAPTER.error_body(HTTPRefusal("slow down", 429))["error"]["code"] == "rate_limit_exceeded"

    def test_a_broken_stream_ends_with_the_api_s_error_event(self) -> None:
        event = ADAPTER.broken_stream_event("the upstream went away")
        assert event.startswith(b"event: error\ndata: ") and b'"event_type": "error"' in event

    def test_the_overflow_opens_with_gemini_s_sentence(self) -> None:
        fitted = fit_body(ADAPTER, {"model": "gpt-4o", "system_instruction": words(3000), "input": "hi"}, 2000)
        refused = ContextLengthExceeded.refused(fitted.plan.result, ADAPTER, {})
        assert refused.message.startswith("The input token count (") and refused.param is None

    @pytest.mark.parametrize(
        "path", ["/v1/interactions", "/v1beta/interactions", "/v1beta1/projects/p/locations/us-central1/interactions"]
    )
    def test_its_paths_are_counted_and_sent_to_the_host_under_the_path_as_written(self, path: str) -> None:
        endpoint = AdapterRegistry().endpoint_for(path)
        assert endpoint is not None and endpoint.api == "interactions" and endpoint.at_host_root
        segments = tuple(path.strip("/").split("/"))
        assert endpoint.upstream_segments(segments, "renamed-model") == segments
