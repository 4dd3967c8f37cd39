"""A `kind: bedrock` upstream's settings: its region, and exactly one way to authenticate."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config.settings import settings_from_dict
from proxy.config.upstreams import UpstreamSettings
from proxy.errors import ConfigError

BASE = "https://bedrock-runtime.eu-west-3.amazonaws.com"


def _upstream(**given: Any) -> UpstreamSettings:
    settings = settings_from_dict({"upstreams": {"bedrock": {"kind": "bedrock", **given}}}, "guard.yaml", {})
    return settings.upstreams["bedrock"]


class TestBedrockUpstreams:
    def test_the_region_is_read_from_the_runtime_host_when_not_named(self) -> None:
        assert _upstream(base_url=BASE, auth="sigv4").region == "eu-west-3"

    def test_a_named_region_wins_over_the_host(self) -> None:
        assert _upstream(base_url=BASE, auth="sigv4", region="us-east-1").region == "us-east-1"

    def test_it_serves_converse_and_invoke_and_nothing_else(self) -> None:
        upstream = _upstream(base_url=BASE, auth="sigv4")
        assert upstream.serves("converse") and upstream.serves("invoke") and not upstream.serves("chat")

    @pytest.mark.parametrize(
        ("given", "key", "said"),
        [
            ({"base_url": "http://127.0.0.1:9000", "auth": "sigv4"}, "region", "needs the AWS region"),
            ({"base_url": BASE, "region": "Virginia", "auth": "sigv4"}, "region", "not an AWS region"),
            ({"base_url": BASE}, "auth", "one of them"),
            ({"base_url": BASE, "auth": "sigv4", "api_key_env": "BEDROCK_KEY"}, "auth", "one of them"),
        ],
    )
    def test_a_bedrock_upstream_without_a_region_or_with_no_single_credential_is_refused(
        self, given: dict[str, Any], key: str, said: str
    ) -> None:
        with pytest.raises(ConfigError, match=said) as refused:
            _upstream(**given)
        assert key in str(refused.value)

    def test_sigv4_is_only_for_bedrock(self) -> None:
        with pytest.raises(ConfigError, match="kind openai signs nothing"):
            settings_from_dict(
                {"upstreams": {"openai": {"kind": "openai", "base_url": "https://api.openai.com/v1", "auth": "sigv4"}}},
                "guard.yaml",
                {},
            )
