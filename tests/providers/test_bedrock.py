"""The Bedrock provider as plain data: the client's AWS headers dropped and the guard's signature
over the final call (checked by botocore's own verifier-side signing), its CountTokens call, its
settings rules."""

from __future__ import annotations

import base64
import json

import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from proxy.providers.bedrock import Bedrock
from proxy.providers.provider import OutgoingCall, SettingsRefused

BASE = "https://bedrock-runtime.us-east-1.amazonaws.com"
URL = f"{BASE}/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse"
KEYS = Credentials("AKIDGUARD", "guard-secret").get_frozen_credentials()


class Upstream:
    """An upstream's settings as `Provider.check` reads them."""

    def __init__(self, **given: object) -> None:
        self.base_url, self.region, self.auth, self.api_key_env = BASE, None, None, None
        self.token_command = self.token_file = None
        self.__dict__.update(given)


class TestFinish:
    def test_the_clients_aws_headers_are_dropped_and_bedrocks_own_kept(self) -> None:
        headers = {
            "X-Amz-Date": "20261202T000000Z", "X-Amz-Security-Token": "client-token",
            "x-amz-content-sha256": "abc", "X-Amzn-Bedrock-Trace": "ENABLED", "Content-Type": "application/json",
        }  # fmt: skip
        finished = Bedrock().finish(OutgoingCall("POST", URL, headers, b"{}"), None)
        assert dict(finished.headers) == {"X-Amzn-Bedrock-Trace": "ENABLED", "Content-Type": "application/json"}

    def test_the_signature_covers_the_final_body_and_verifies(self) -> None:
        body = b'{"messages": []}'
        call = OutgoingCall("POST", URL, {"Content-Type": "application/json", "Authorization": "client's"}, body)
        signed = Bedrock().finish(call, (KEYS, "us-east-1")).headers
        # An independent signing of the same request at the same instant gives the same signature.
        check = AWSRequest(method="POST", url=URL, data=body, headers={"Content-Type": "application/json"})
        check.context["timestamp"] = signed["X-Amz-Date"]
        SigV4Auth(KEYS, "bedrock", "us-east-1").add_auth(check)
        assert signed["Authorization"] == check.headers["Authorization"]
        assert "Credential=AKIDGUARD/" in signed["Authorization"] and "client's" not in signed.values()


class TestCountCall:
    def test_a_profiles_converse_request_is_counted_for_its_foundation_model(self) -> None:
        body = {"messages": [{"role": "user", "content": [{"text": "hi"}]}], "inferenceConfig": {"maxTokens": 9}}
        call = Bedrock().count_call(BASE, "us.anthropic.claude-sonnet-4-5-20250929-v1:0", "converse", body)
        assert call is not None and call.answer_field == "inputTokens"
        assert call.url == f"{BASE}/model/anthropic.claude-sonnet-4-5-20250929-v1:0/count-tokens"
        assert call.body == {"input": {"converse": {"messages": body["messages"]}}}

    def test_an_invoke_body_is_counted_whole_as_a_blob(self) -> None:
        body = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 5, "messages": []}
        call = Bedrock().count_call(BASE, "anthropic.claude-3-haiku-20240307-v1:0", "invoke", body)
        assert call is not None
        assert json.loads(base64.b64decode(call.body["input"]["invokeModel"]["body"])) == body

    def test_no_count_call_for_a_shape_bedrock_does_not_serve(self) -> None:
        assert Bedrock().count_call(BASE, "m", "chat", {"messages": []}) is None


class TestCheck:
    def test_the_region_is_read_from_the_runtime_host(self) -> None:
        upstream = Upstream(auth="sigv4", base_url="https://bedrock-runtime.eu-west-3.amazonaws.com")
        Bedrock().check(upstream)
        assert upstream.region == "eu-west-3"

    @pytest.mark.parametrize(
        ("given", "key"),
        [
            ({"auth": "sigv4", "base_url": "http://127.0.0.1:9"}, "region"),
            ({"auth": "sigv4", "region": "mars"}, "region"),
            ({"auth": "sigv4", "api_key_env": "BEDROCK_KEY"}, "auth"),
            ({}, "auth"),
        ],
    )
    def test_settings_it_cannot_work_with_are_refused_naming_the_key(self, given: dict[str, object], key: str) -> None:
        with pytest.raises(SettingsRefused) as refused:
            Bedrock().check(Upstream(**given))
        assert refused.value.key == key
