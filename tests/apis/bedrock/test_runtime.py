"""bedrock-runtime's paths read once, and the model a request is routed, counted and sent by."""

from __future__ import annotations

import base64

import pytest

from proxy.apis.base import InvalidRequest
from proxy.apis.bedrock.runtime import CountTokensAdapter, InvokeAdapter, bedrock_path, routed_model, upstream_path
from proxy.apis.registry import AdapterRegistry

SONNET = "anthropic.claude-sonnet-4-5-20250929-v1:0"
ARN = f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.{SONNET}"
REGISTRY = AdapterRegistry()


class TestPaths:
    @pytest.mark.parametrize(
        ("raw", "canonical"),
        [
            ("/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse", f"/model/{SONNET}/converse"),
            (f"/model/{SONNET}/invoke-with-response-stream", f"/model/{SONNET}/invoke-with-response-stream"),
            ("/model/arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus."
             "anthropic.claude-sonnet-4-5-20250929-v1%3A0/count-tokens",
             f"/model/{ARN.replace('/', '%2F')}/count-tokens"),
        ],
    )  # fmt: skip
    def test_an_encoded_id_or_arn_is_one_segment_of_the_canonical_path(self, raw: str, canonical: str) -> None:
        assert bedrock_path(raw) == canonical

    @pytest.mark.parametrize("raw", ["/model/..%2F..%2Fadmin/converse", "/model/a%20b/invoke", "/model/%FF/converse"])
    def test_an_id_no_bedrock_model_has_is_refused(self, raw: str) -> None:
        with pytest.raises(ValueError):
            bedrock_path(raw)

    def test_other_paths_are_not_bedrocks(self) -> None:
        assert bedrock_path("/v1/chat/completions") is None and bedrock_path(f"/model/{SONNET}/delete") is None

    def test_each_operation_has_its_adapter_and_its_stream(self) -> None:
        endpoints = {op: REGISTRY.endpoint_for(f"/model/{SONNET}/{op}") for op in
                     ("converse", "converse-stream", "invoke", "invoke-with-response-stream", "count-tokens")}  # fmt: skip
        assert {op: (e.api, e.stream, e.local) for op, e in endpoints.items() if e is not None} == {
            "converse": ("converse", False, False),
            "converse-stream": ("converse", True, False),
            "invoke": ("invoke", False, False),
            "invoke-with-response-stream": ("invoke", True, False),
            "count-tokens": ("bedrock.count_tokens", False, True),
        }


class TestModels:
    def test_an_inference_profiles_arn_is_routed_by_the_profile_and_sent_as_the_arn(self) -> None:
        assert routed_model(ARN) == f"us.{SONNET}"
        assert upstream_path(ARN, "converse", f"us.{SONNET}") == "/model/" + ARN.replace(":", "%3A").replace(
            "/", "%2F"
        ) + "/converse"

    def test_a_routes_rename_is_what_is_sent(self) -> None:
        assert upstream_path(SONNET, "invoke", "us.anthropic.claude-haiku-4-5-20251001-v1:0") == (
            "/model/us.anthropic.claude-haiku-4-5-20251001-v1%3A0/invoke"
        )

    def test_an_application_profile_names_no_model_and_is_routed_as_its_arn(self) -> None:
        arn = "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3"
        assert routed_model(arn) == arn


class TestCountTokens:
    @pytest.mark.parametrize("encode", [True, False], ids=["base64", "as a string"])
    def test_an_invoke_body_nested_past_the_interpreters_limit_is_refused_as_unreadable(self, encode: bool) -> None:
        nested = "[" * 200_000 + "]" * 200_000
        text = base64.b64encode(nested.encode()).decode() if encode else nested
        with pytest.raises(InvalidRequest, match="must be the request body"):
            CountTokensAdapter().parse({"input": {"invokeModel": {"body": text}}})


class TestInvoke:
    def test_a_body_that_is_not_claudes_messages_is_refused_naming_converse(self) -> None:
        with pytest.raises(InvalidRequest, match="Converse"):
            InvokeAdapter().parse({"prompt": "[INST] hi [/INST]", "max_tokens": 64})

    def test_claudes_body_is_read_by_the_messages_adapter(self) -> None:
        body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64, "system": "Be brief.",
                "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
        parsed = InvokeAdapter().parse(body)
        assert [m["role"] for m in parsed.messages] == ["system", "user"] and parsed.chat["max_tokens"] == 64
