"""Chat completions: the first adapter, whose view is the body itself."""

from __future__ import annotations

import pytest

from proxy.apis.base import InvalidRequest
from proxy.apis.openai.chat import ChatAdapter
from proxy.core.trimming.turns import validity_problems
from proxy.errors import BadRequest
from tests.apis.fitting import fit_body, words


def conversation() -> dict:
    return {
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "old question " + words(900)},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": words(600)},
            {"role": "assistant", "content": "old answer"},
            {"role": "user", "content": "latest question"},
        ],
        "temperature": 0.2,
        "x-vendor": {"keep": [1, 2]},
    }


class TestParse:
    def test_the_view_is_the_body_itself(self) -> None:
        body = conversation()
        parsed = ChatAdapter().parse(body)
        assert parsed.chat is body and parsed.model == "gpt-4o"

    def test_each_message_comes_from_its_own_position(self) -> None:
        parsed = ChatAdapter().parse(conversation())
        assert [parsed.where(i) for i in range(3)] == ["messages[0]", "messages[1]", "messages[2]"]

    def test_a_missing_model_is_left_to_the_path(self) -> None:
        body = conversation()
        del body["model"]
        assert ChatAdapter().parse(body).model is None

    def test_missing_messages_are_refused_naming_the_field(self) -> None:
        with pytest.raises(InvalidRequest) as error:
            ChatAdapter().parse({"model": "gpt-4o"})
        assert error.value.param == "messages"

    def test_a_body_that_is_not_an_object_is_refused(self) -> None:
        with pytest.raises(InvalidRequest):
            ChatAdapter().parse(["not", "an", "object"])

    def test_the_output_reserve_field_is_the_one_the_body_uses(self) -> None:
        parsed = ChatAdapter().parse({**conversation(), "max_completion_tokens": 100})
        assert parsed.reserve_field == "max_completion_tokens"


class TestRender:
    def test_a_request_that_fits_is_forwarded_as_the_very_body_received(self) -> None:
        body = conversation()
        fitted = fit_body(ChatAdapter(), body, 128_000)
        assert fitted.body is body and not fitted.changed

    def test_a_trimmed_request_drops_the_old_turn_and_keeps_every_other_field(self) -> None:
        body = conversation()
        # Caps as large as the budget: the old turn goes whole rather than shortened.
        whole_turns = {"shrink_tool_results": {"cap_share": 1.0}, "shrink_messages": {"cap_share": 1.0}}
        fitted = fit_body(ChatAdapter(), body, 1200, options=whole_turns)
        assert fitted.plan.result.outcome == "trimmed"
        assert [m["content"] for m in fitted.body["messages"]] == ["You are terse.", "latest question"]
        assert fitted.body["x-vendor"] == {"keep": [1, 2]} and fitted.body["temperature"] == 0.2
        assert validity_problems(fitted.body["messages"]) == []

    def test_render_of_an_untouched_view_equals_the_original(self) -> None:
        adapter = ChatAdapter()
        parsed = adapter.parse(conversation())
        assert adapter.render(parsed, parsed.chat, ()) == conversation()

    def test_errors_have_the_openai_shape(self) -> None:
        error = ChatAdapter().error_body(BadRequest("bad", param="messages"))
        assert error == {
            "error": {"message": "bad", "type": "invalid_request_error", "param": "messages", "code": "invalid_request"}
        }
