"""Bedrock Converse bodies read into the chat view, and cuts written back as Converse blocks."""

from __future__ import annotations

import base64
import itertools
from typing import Any

import pytest

from proxy.apis.base import InvalidRequest
from proxy.apis.bedrock.converse import ConverseAdapter, exception_name, foundation_model
from tests.apis.fitting import fit_body, words
from tests.support.trimming import tokenizer

ADAPTER = ConverseAdapter()


def _tool_turn(k: int, size: int) -> list[dict[str, Any]]:
    call = {"toolUse": {"toolUseId": f"t{k}", "name": "read_file", "input": {"path": f"f{k}.py"}}}
    result = {"toolResult": {"toolUseId": f"t{k}", "content": [{"text": words(size, f"w{k}")}], "status": "success"}}
    return [
        {"role": "user", "content": [{"text": f"Read file {k}."}]},
        {"role": "assistant", "content": [{"text": "Reading."}, call]},
        {"role": "user", "content": [result]},
        {"role": "assistant", "content": [{"text": f"File {k} read."}]},
    ]


def _conversation(turns: int, size: int) -> dict[str, Any]:
    messages = [m for k in range(turns) for m in _tool_turn(k, size)]
    messages.append({"role": "user", "content": [{"text": "Now summarise every file."}]})
    return {
        "system": [{"text": "You are a careful coding agent."}, {"cachePoint": {"type": "default"}}],
        "messages": messages,
        "inferenceConfig": {"maxTokens": 1024, "temperature": 0.2},
        "toolConfig": {
            "tools": [
                {
                    "toolSpec": {
                        "name": "read_file",
                        "description": "Read a file.",
                        "inputSchema": {"json": {"type": "object"}},
                    }
                }
            ]
        },
    }


def _calls_and_results(body: dict[str, Any]) -> tuple[set[str], set[str]]:
    calls, results = set(), set()
    for message in body["messages"]:
        for block in message["content"]:
            if "toolUse" in block:
                calls.add(block["toolUse"]["toolUseId"])
            if "toolResult" in block:
                results.add(block["toolResult"]["toolUseId"])
    return calls, results


class TestFoundationModel:
    @pytest.mark.parametrize(
        ("model_id", "expected"),
        [
            ("anthropic.claude-sonnet-4-5-20250929-v1:0", "anthropic.claude-sonnet-4-5-20250929-v1:0"),
            ("anthropic.claude-sonnet-4-5-20250929-v1%3A0", "anthropic.claude-sonnet-4-5-20250929-v1:0"),
            ("us.anthropic.claude-sonnet-4-5-20250929-v1:0", "anthropic.claude-sonnet-4-5-20250929-v1:0"),
            ("global.anthropic.claude-sonnet-4-5-20250929-v1:0", "anthropic.claude-sonnet-4-5-20250929-v1:0"),
            (
                "arn:aws:bedrock:us-east-1::foundation-model/meta.llama3-1-70b-instruct-v1:0",
                "meta.llama3-1-70b-instruct-v1:0",
            ),
            (
                "arn:aws:bedrock:us-east-1:123456789012:inference-profile/eu.amazon.nova-pro-v1:0",
                "amazon.nova-pro-v1:0",
            ),
        ],
    )
    def test_the_model_inside_an_id_profile_or_arn_is_found(self, model_id: str, expected: str) -> None:
        assert foundation_model(model_id) == expected

    def test_an_application_profile_names_no_model_and_stays_as_it_is(self) -> None:
        arn = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3"
        assert foundation_model(arn) == arn


class TestParse:
    def test_tool_use_and_its_result_pair_up_as_a_call_and_a_tool_message(self) -> None:
        parsed = ADAPTER.parse(_conversation(1, 10))
        roles = [m["role"] for m in parsed.messages]
        assert roles == ["system", "user", "assistant", "tool", "assistant", "user"]
        assert parsed.messages[2]["tool_calls"][0]["id"] == "t0" and parsed.messages[3]["tool_call_id"] == "t0"
        assert parsed.chat["max_tokens"] == 1024 and parsed.chat["tools"][0]["function"]["name"] == "read_file"

    def test_a_cache_point_adds_no_text(self) -> None:
        with_point = ADAPTER.parse(_conversation(1, 10))
        body = _conversation(1, 10)
        body["system"] = body["system"][:1]
        without = ADAPTER.parse(body)
        count = tokenizer("gpt-4o")
        texts = [p.get("text", "") for m in with_point.messages if isinstance(m["content"], list) for p in m["content"]]
        assert sum(len(count.encode(t)) for t in texts) == sum(
            len(count.encode(p.get("text", "")))
            for m in without.messages
            if isinstance(m["content"], list)
            for p in m["content"]
        )

    def test_a_text_document_is_read_as_its_text(self) -> None:
        doc = {
            "document": {
                "format": "txt",
                "name": "notes",
                "source": {"bytes": base64.b64encode(b"plain notes").decode()},
            }
        }
        parsed = ADAPTER.parse({"messages": [{"role": "user", "content": [doc, {"text": "Summarise."}]}]})
        assert parsed.messages[0]["content"][0] == {"type": "text", "text": "plain notes"}

    def test_a_json_tool_result_is_counted_as_its_json(self) -> None:
        result = {"toolResult": {"toolUseId": "t", "content": [{"json": {"rows": [1, 2, 3]}}]}}
        call = {"toolUse": {"toolUseId": "t", "name": "q", "input": {}}}
        body = {"messages": [{"role": "user", "content": [{"text": "q"}]}, {"role": "assistant", "content": [call]},
                             {"role": "user", "content": [result]}]}  # fmt: skip
        assert ADAPTER.parse(body).messages[2]["content"][0]["text"] == '{"rows": [1, 2, 3]}'

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({"messages": []}, "messages"),
            ({"messages": [{"role": "user", "content": "hi"}]}, "messages.0.content"),
            ({"messages": [{"role": "user", "content": [{"text": "a", "image": {}}]}]}, "messages.0.content.0"),
            ({"messages": [{"role": "user", "content": [{"text": "hi"}]}], "inferenceConfig": {"maxTokens": 0}},
             "inferenceConfig.maxTokens"),
        ],
    )  # fmt: skip
    def test_a_malformed_body_is_refused_naming_the_field(self, body: dict[str, Any], param: str) -> None:
        with pytest.raises(InvalidRequest) as refused:
            ADAPTER.parse(body)
        assert refused.value.param == param


class TestRender:
    def test_a_fitting_body_is_forwarded_as_it_came(self) -> None:
        body = _conversation(2, 20)
        fitted = fit_body(ADAPTER, body, window=100_000)
        assert not fitted.changed and fitted.body == body

    def test_over_the_window_old_tool_exchanges_go_whole_and_the_rest_stays_converse(self) -> None:
        body = _conversation(8, 600)
        fitted = fit_body(ADAPTER, body, window=6_000)
        sent = fitted.body
        assert fitted.changed and fitted.plan.result.fits
        calls, results = _calls_and_results(sent)
        assert calls == results  # every call kept has its result, and no result lost its call
        assert sent["system"] == body["system"]
        assert sent["messages"][-1] == body["messages"][-1]
        assert sent["messages"][0]["role"] == "user"
        roles = [m["role"] for m in sent["messages"]]
        assert all(a != b for a, b in itertools.pairwise(roles))  # roles still alternate
        for message in sent["messages"]:
            assert all(len(block) == 1 for block in message["content"])  # every block still a Converse block

    def test_a_lowered_reserve_is_written_to_max_tokens_and_other_settings_kept(self) -> None:
        body = _conversation(1, 50)
        body["inferenceConfig"] = {"maxTokens": 8_000, "temperature": 0.2}
        options = {"clamp_max_tokens": {"floor": 100}}
        fitted = fit_body(ADAPTER, body, window=8_400, pipeline=("clamp_max_tokens",), options=options)
        assert fitted.body["inferenceConfig"]["temperature"] == 0.2
        assert fitted.body["inferenceConfig"]["maxTokens"] < 8_000


class TestErrors:
    def test_errors_take_bedrocks_shape_and_exception_names(self) -> None:
        from proxy.errors import GuardError

        error = GuardError("too long", param="messages")
        assert ADAPTER.error_body(error) == {"message": "messages: too long"}
        assert exception_name(400) == "ValidationException" and exception_name(429) == "ThrottlingException"
