"""What the guard reads from Bedrock's answers (usage, its own overflow), how it ends a broken event
stream, and a boto3 client that authenticates with a Bedrock API key over https."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from tests.server.conftest import Logs
from tests.support.bedrock_upstream import (
    REGION,
    FakeBedrock,
    boto3_client,
    guard_before,
    prompt_tokens,
    self_signed,
)

SONNET = "anthropic.claude-sonnet-4-5-20250929-v1:0"
HELLO = [{"role": "user", "content": [{"text": "Say hello in five words."}]}]
CLAUDE_HELLO = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64,
                "messages": [{"role": "user", "content": "Say hello in five words."}]}  # fmt: skip


class TestUsage:
    async def test_the_providers_usage_is_logged_from_a_whole_answer_and_from_both_streams(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None, logs: Logs
    ) -> None:
        fake = FakeBedrock()
        client = boto3_client(await guard_before(aiohttp_server, model_map, fake))
        await asyncio.to_thread(client.converse, modelId=SONNET, messages=HELLO)
        answer = await asyncio.to_thread(client.converse_stream, modelId=SONNET, messages=HELLO)
        await asyncio.to_thread(lambda: list(answer["stream"]))
        streamed = await asyncio.to_thread(
            client.invoke_model_with_response_stream, modelId=SONNET, body=json.dumps(CLAUDE_HELLO)
        )
        await asyncio.to_thread(lambda: list(streamed["body"]))
        lines = await logs.written("request", 3)
        expected = [prompt_tokens(fake.received[k].json()) for k in range(3)]
        assert [line.get("provider_prompt_tokens") for line in lines] == expected
        assert [line["kind"] for line in lines] == ["converse", "converse", "invoke"]


class TestBrokenStreams:
    @pytest.mark.parametrize("operation", ["converse_stream", "invoke_model_with_response_stream"])
    async def test_a_stream_the_upstream_breaks_ends_with_an_exception_boto3_raises(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None, operation: str
    ) -> None:
        fake = FakeBedrock(break_after=2)
        client = boto3_client(await guard_before(aiohttp_server, model_map, fake))

        def read() -> list[Any]:
            if operation == "converse_stream":
                return list(client.converse_stream(modelId=SONNET, messages=HELLO)["stream"])
            return list(client.invoke_model_with_response_stream(modelId=SONNET, body=json.dumps(CLAUDE_HELLO))["body"])

        with pytest.raises(botocore.exceptions.EventStreamError) as broken:
            await asyncio.to_thread(read)
        assert broken.value.response["Error"]["Code"] == "modelStreamErrorException"
        assert "ended the stream early" in broken.value.response["Error"]["Message"]


class TestTheProvidersOverflow:
    async def test_bedrocks_own_overflow_teaches_the_window_and_the_request_is_sent_again_within_it(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None
    ) -> None:
        """The guard believes in 64k; Bedrock says 16k in Claude's words, relayed by Bedrock."""
        fake = FakeBedrock()
        window = {"overrides": [{"match": "*claude-sonnet-4-5*", "context_window": 64_000}]}
        client = boto3_client(await guard_before(aiohttp_server, model_map, fake, sections={"models": window}))
        messages = [*[{"role": r, "content": [{"text": " ".join([f"w{k}"] * 1500)}]}
                      for k, r in enumerate(["user", "assistant"] * 8)], *HELLO]  # fmt: skip
        await asyncio.to_thread(client.converse, modelId=SONNET, messages=messages)
        sent = [r.json() for r in fake.received if r.operation == "converse"]
        assert len(sent) == 2 and prompt_tokens(sent[0]) > fake.window >= prompt_tokens(sent[1])
        assert sent[1]["messages"][-1] == HELLO[0]


class TestBedrockApiKeys:
    async def test_a_client_with_a_bedrock_api_key_is_served_over_https_with_the_guards_own_key(
        self, aiohttp_server: Any, model_map: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """boto3 sends `AWS_BEARER_TOKEN_BEDROCK` (here the guard's client key) only over https; the
        guard checks it and sends Bedrock the key it holds instead."""
        context, certificate = self_signed(tmp_path)
        monkeypatch.setenv("BEDROCK_KEY", "guard-bedrock-key")
        fake = FakeBedrock(api_key="guard-bedrock-key")
        upstream = {"auth": None, "api_key_env": "BEDROCK_KEY"}
        sections = {"server": {"client_keys": ["team-key-1"]}, "models": {
            "overrides": [{"match": "*claude-sonnet-4-5*", "context_window": 16_000}]}}  # fmt: skip
        guard = await guard_before(aiohttp_server, model_map, fake, upstream=upstream, sections=sections, ssl=context)
        assert guard.startswith("https://")
        monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", "team-key-1")
        client = boto3.client("bedrock-runtime", region_name=REGION, endpoint_url=guard, verify=certificate,
                              config=Config(retries={"max_attempts": 1}))  # fmt: skip
        messages = [*[{"role": r, "content": [{"text": " ".join([f"w{k}"] * 1500)}]}
                      for k, r in enumerate(["user", "assistant"] * 12)], *HELLO]  # fmt: skip
        await asyncio.to_thread(client.converse, modelId=SONNET, messages=messages)
        sent = fake.last("converse")
        assert sent.headers["Authorization"] == "Bearer guard-bedrock-key" and fake.refused == []
        assert prompt_tokens(sent.json()) <= fake.window and sent.json()["messages"][-1] == HELLO[0]
        monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", "not-a-team-key")
        stranger = boto3.client("bedrock-runtime", region_name=REGION, endpoint_url=guard, verify=certificate,
                                config=Config(retries={"max_attempts": 1}))  # fmt: skip
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            await asyncio.to_thread(stranger.converse, modelId=SONNET, messages=HELLO)
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 401 and len(fake.received) == 1


class TestTheProvidersCountAtTheEdge:
    async def test_where_claudes_bound_straddles_the_budget_bedrocks_count_tokens_decides_signed(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None
    ) -> None:
        """Claude's count is a bound; just over the budget by it, within by Bedrock's own count: asked,
        signed with the guard's credentials, and the request goes whole."""
        fake = FakeBedrock()
        window = {"overrides": [{"match": "*claude-sonnet-4-5*", "context_window": 16_000}]}
        client = boto3_client(await guard_before(aiohttp_server, model_map, fake, sections={"models": window}))
        messages = [*[{"role": r, "content": [{"text": " ".join([f"w{k}"] * 1150)}]}
                      for k, r in enumerate(["user", "assistant"] * 3)], *HELLO]  # fmt: skip
        answer = await asyncio.to_thread(
            client.converse, modelId=f"us.{SONNET}", messages=messages, inferenceConfig={"maxTokens": 512}
        )
        asked = [r for r in fake.received if r.operation == "count-tokens"]
        assert len(asked) == 1 and asked[0].model == SONNET and fake.refused == []
        assert asked[0].json() == {"input": {"converse": {"messages": messages}}}
        assert fake.last("converse").json()["messages"] == messages
        headers = answer["ResponseMetadata"]["HTTPHeaders"]
        assert int(headers["x-context-guard-tokens-before"]) == prompt_tokens({"messages": messages})
