"""The echo upstream speaks bedrock-runtime: boto3 through the guard (`serve --upstream echo`) gets
Converse and InvokeModel answers, whole and streamed, carrying the echo's report of what arrived."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import boto3
import botocore.exceptions
import pytest
from botocore.config import Config

from proxy.config.settings import settings_from_dict
from proxy.demo.echo import running_echo
from proxy.demo.echo.echo_app import with_echo_upstream
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app

SONNET = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
HELLO = [{"role": "user", "content": [{"text": "Say hello."}]}]


def _client(url: str) -> Any:
    return boto3.client("bedrock-runtime", region_name="us-east-1", endpoint_url=url, aws_access_key_id="AKIDECHO",
                        aws_secret_access_key="echo", config=Config(retries={"max_attempts": 1}))  # fmt: skip


async def _guard(aiohttp_server: Any, model_map: Any, echo_url: str) -> str:
    settings = with_echo_upstream(settings_from_dict({}, "echo.yaml", {}), echo_url)
    return str((await aiohttp_server(create_app(settings, Models(settings, model_map)))).make_url("")).rstrip("/")


class TestEchoSpeaksBedrock:
    async def test_converse_whole_and_streamed_carries_the_report(self, aiohttp_server: Any, model_map: Any) -> None:
        async with running_echo() as echo:
            client = _client(await _guard(aiohttp_server, model_map, echo))
            whole = await asyncio.to_thread(client.converse, modelId=SONNET, system=[{"text": "Be brief."}],
                                            messages=HELLO)  # fmt: skip
            streamed = await asyncio.to_thread(lambda: list(client.converse_stream(modelId=SONNET, messages=HELLO)["stream"]))
        text = whole["output"]["message"]["content"][0]["text"]
        assert "2 messages" in text and whole["usage"]["inputTokens"] > 0
        assert next(iter(streamed[0])) == "messageStart" and next(iter(streamed[-1])) == "metadata"
        assert "".join(e["contentBlockDelta"]["delta"]["text"] for e in streamed if "contentBlockDelta" in e)

    async def test_invoke_whole_and_streamed_is_claudes_messages_answer(self, aiohttp_server: Any, model_map: Any) -> None:
        body = json.dumps({"anthropic_version": "bedrock-2023-05-31", "max_tokens": 64,
                           "messages": [{"role": "user", "content": "Say hello."}]})  # fmt: skip
        async with running_echo() as echo:
            client = _client(await _guard(aiohttp_server, model_map, echo))
            answer = await asyncio.to_thread(lambda: json.loads(client.invoke_model(modelId=SONNET, body=body)["body"].read()))
            events = await asyncio.to_thread(
                lambda: list(client.invoke_model_with_response_stream(modelId=SONNET, body=body)["body"])
            )
        streamed = [json.loads(event["chunk"]["bytes"])["type"] for event in events]
        assert answer["type"] == "message" and answer["echo"]["messages"] == 1
        assert streamed[0] == "message_start" and streamed[-1] == "message_stop"

    async def test_a_bad_body_is_refused_in_bedrocks_shape(self, aiohttp_server: Any, model_map: Any) -> None:
        async with running_echo() as echo:
            client = _client(await _guard(aiohttp_server, model_map, echo))
            with pytest.raises(botocore.exceptions.ClientError) as refused:
                await asyncio.to_thread(client.invoke_model, modelId=SONNET, body=json.dumps({"prompt": "hi"}))
        assert refused.value.response["Error"]["Code"] == "ValidationException"
