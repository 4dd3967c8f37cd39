"""boto3's bedrock-runtime client, with its own dummy credentials, through the guard to a Bedrock
that verifies the guard's SigV4 signature and enforces a 16k window (tests/support/bedrock_upstream.py)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator
from typing import Any

import aiohttp
import botocore.exceptions
import pytest

from tests.support.bedrock_upstream import (
    GUARD_TOKEN,
    FakeBedrock,
    boto3_client,
    guard_before,
    prompt_tokens,
)

SONNET = "anthropic.claude-sonnet-4-5-20250929-v1:0"
PROFILE_ARN = f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.{SONNET}"
SYSTEM = "You are a careful coding agent. Keep every answer short."
TOOL = {"toolSpec": {"name": "read_file", "description": "Read a file.",
                     "inputSchema": {"json": {"type": "object", "properties": {"path": {"type": "string"}}}}}}  # fmt: skip
WINDOW = {"overrides": [{"match": "*claude-sonnet-4-5*", "context_window": 16_000}]}


def _history(turns: int, size: int) -> list[dict[str, Any]]:
    """A Converse tool loop, each file read answered with `size` words."""
    messages: list[dict[str, Any]] = []
    for k in range(turns):
        call = {"toolUse": {"toolUseId": f"t{k}", "name": "read_file", "input": {"path": f"f{k}.py"}}}
        result = {"toolResult": {"toolUseId": f"t{k}", "content": [{"text": " ".join([f"w{k}"] * size)}]}}
        messages += [
            {"role": "user", "content": [{"text": f"Read file {k}."}]},
            {"role": "assistant", "content": [{"text": "Reading."}, call]},
            {"role": "user", "content": [result]},
            {"role": "assistant", "content": [{"text": f"File {k} read."}]},
        ]
    return [*messages, {"role": "user", "content": [{"text": "Now summarise every file."}]}]


def _claude_history(turns: int, size: int) -> list[dict[str, Any]]:
    """The same loop as Anthropic Messages blocks (an InvokeModel body's)."""
    messages: list[dict[str, Any]] = []
    for k in range(turns):
        call = {"type": "tool_use", "id": f"t{k}", "name": "read_file", "input": {"path": f"f{k}.py"}}
        result = {"type": "tool_result", "tool_use_id": f"t{k}", "content": " ".join([f"w{k}"] * size)}
        messages += [
            {"role": "user", "content": f"Read file {k}."},
            {"role": "assistant", "content": [{"type": "text", "text": "Reading."}, call]},
            {"role": "user", "content": [result]},
            {"role": "assistant", "content": f"File {k} read."},
        ]
    return [*messages, {"role": "user", "content": "Now summarise every file."}]


def _converse_pairs(messages: list[dict[str, Any]]) -> Iterator[tuple[set[str], set[str]]]:
    """Each toolResult message's ids, beside the ids of the toolUse blocks just before it."""
    for before, message in itertools.pairwise(messages):
        results = {b["toolResult"]["toolUseId"] for b in message["content"] if "toolResult" in b}
        if results:
            yield results, {b["toolUse"]["toolUseId"] for b in before["content"] if "toolUse" in b}


def _claude_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 512, "system": SYSTEM, "messages": messages,
            "tools": [{"name": "read_file", "input_schema": {"type": "object"}}], **extra}  # fmt: skip


class TestConverse:
    async def test_over_the_window_it_is_forwarded_within_it_signed_with_pairs_system_and_latest_turn_kept(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None
    ) -> None:
        fake = FakeBedrock()
        guard = await guard_before(aiohttp_server, model_map, fake, sections={"models": WINDOW})
        messages = _history(12, 1500)
        assert prompt_tokens({"messages": messages}) > 2 * fake.window  # the provider alone would refuse it
        answer = await asyncio.to_thread(
            boto3_client(guard).converse, modelId=SONNET, system=[{"text": SYSTEM}], messages=messages,
            inferenceConfig={"maxTokens": 512}, toolConfig={"tools": [TOOL]},
        )  # fmt: skip
        sent = fake.last("converse").json()
        assert answer["output"]["message"]["content"] == [{"text": "Done."}] and fake.refused == []
        assert prompt_tokens(sent) <= fake.window < prompt_tokens({"messages": messages})
        assert sent["system"] == [{"text": SYSTEM}] and sent["messages"][-1] == messages[-1]
        assert all(results <= calls for results, calls in _converse_pairs(sent["messages"]))
        assert sent["messages"][0]["role"] == "user" and sent["toolConfig"] == {"tools": [TOOL]}

    async def test_a_stream_over_the_window_is_trimmed_and_every_event_decoded_by_boto3(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None
    ) -> None:
        fake = FakeBedrock()
        guard = await guard_before(aiohttp_server, model_map, fake, sections={"models": WINDOW})

        def events() -> list[str]:
            answer = boto3_client(guard).converse_stream(
                modelId=SONNET, system=[{"text": SYSTEM}], messages=_history(12, 1500)
            )
            return [next(iter(event)) for event in answer["stream"]]

        assert await asyncio.to_thread(events) == [
            "messageStart", "contentBlockDelta", "contentBlockDelta", "contentBlockStop", "messageStop", "metadata",
        ]  # fmt: skip
        assert prompt_tokens(fake.last("converse-stream").json()) <= fake.window and fake.refused == []

    async def test_a_system_prompt_alone_over_the_window_is_refused_as_a_validation_exception(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None
    ) -> None:
        fake = FakeBedrock()
        guard = await guard_before(aiohttp_server, model_map, fake, sections={"models": WINDOW})
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            await asyncio.to_thread(
                boto3_client(guard).converse, modelId=SONNET, system=[{"text": " ".join(["huge"] * 20_000)}],
                messages=[{"role": "user", "content": [{"text": "hi"}]}],
            )  # fmt: skip
        error = refused.value.response["Error"]
        assert (
            error["Code"] == "ValidationException"
            and refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
        )
        assert "prompt is too long:" in error["Message"] and "maximum" in error["Message"]
        assert fake.received == []

    async def test_a_fitting_request_is_forwarded_as_the_client_sent_it(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None
    ) -> None:
        fake = FakeBedrock()
        guard = await guard_before(aiohttp_server, model_map, fake, sections={"models": WINDOW})
        messages = _history(2, 50)
        await asyncio.to_thread(boto3_client(guard).converse, modelId=SONNET, system=[{"text": SYSTEM}], messages=messages)
        assert fake.last("converse").json() == {"system": [{"text": SYSTEM}], "messages": messages}


class TestInvokeModel:
    async def test_claude_over_the_window_is_forwarded_within_it_with_pairs_and_the_latest_turn(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None
    ) -> None:
        fake = FakeBedrock()
        guard = await guard_before(aiohttp_server, model_map, fake, sections={"models": WINDOW})
        body = _claude_body(_claude_history(12, 1500))
        client = boto3_client(guard)
        answer = await asyncio.to_thread(
            lambda: json.loads(client.invoke_model(modelId=SONNET, body=json.dumps(body))["body"].read())
        )
        sent = fake.last("invoke").json()
        assert answer["content"] == [{"type": "text", "text": "Done."}]
        assert prompt_tokens(sent) <= fake.window and fake.refused == [] and "model" not in sent
        assert sent["system"] == SYSTEM and sent["messages"][-1] == body["messages"][-1]
        assert sent["anthropic_version"] == "bedrock-2023-05-31" and sent["messages"][0]["role"] == "user"
        ids = [b.get("id") or b.get("tool_use_id") for m in sent["messages"] if isinstance(m["content"], list)
               for b in m["content"] if b["type"] in ("tool_use", "tool_result")]  # fmt: skip
        assert ids and all(ids[i] == ids[i + 1] for i in range(0, len(ids), 2))

    async def test_the_response_stream_is_trimmed_and_every_chunk_decoded_by_boto3(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None
    ) -> None:
        fake = FakeBedrock()
        guard = await guard_before(aiohttp_server, model_map, fake, sections={"models": WINDOW})

        def kinds() -> list[str]:
            answer = boto3_client(guard).invoke_model_with_response_stream(
                modelId=SONNET, body=json.dumps(_claude_body(_claude_history(12, 1500)))
            )
            return [json.loads(event["chunk"]["bytes"])["type"] for event in answer["body"]]

        assert await asyncio.to_thread(kinds) == [
            "message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
            "message_stop",
        ]  # fmt: skip
        assert prompt_tokens(fake.last("invoke-with-response-stream").json()) <= fake.window

    async def test_a_fitting_body_reaches_bedrock_byte_for_byte(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None
    ) -> None:
        fake = FakeBedrock()
        guard = await guard_before(aiohttp_server, model_map, fake, sections={"models": WINDOW})
        body = json.dumps(_claude_body(_claude_history(2, 50)), indent=1).encode()
        await asyncio.to_thread(boto3_client(guard).invoke_model, modelId=SONNET, body=body)
        assert fake.last("invoke").body == body and fake.refused == []

    async def test_another_models_native_body_is_refused_naming_converse(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None
    ) -> None:
        fake = FakeBedrock()
        guard = await guard_before(aiohttp_server, model_map, fake)
        body = json.dumps({"prompt": "<|begin_of_text|>hi", "max_gen_len": 64})
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            await asyncio.to_thread(boto3_client(guard).invoke_model, modelId="meta.llama3-1-70b-instruct-v1:0", body=body)
        assert refused.value.response["Error"]["Code"] == "ValidationException"
        assert "Converse" in refused.value.response["Error"]["Message"] and fake.received == []


class TestCountTokens:
    async def test_count_tokens_is_answered_by_the_guard_with_at_least_the_providers_count(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None
    ) -> None:
        fake = FakeBedrock()
        guard = await guard_before(aiohttp_server, model_map, fake)
        converse = {"system": [{"text": SYSTEM}], "messages": _history(3, 200)}
        counted = await asyncio.to_thread(boto3_client(guard).count_tokens, modelId=SONNET, input={"converse": converse})
        invoke = {"invokeModel": {"body": json.dumps(_claude_body(_claude_history(3, 200)))}}
        counted_invoke = await asyncio.to_thread(boto3_client(guard).count_tokens, modelId=SONNET, input=invoke)
        assert counted["inputTokens"] >= prompt_tokens(converse) and fake.received == []
        assert counted_invoke["inputTokens"] >= prompt_tokens(json.loads(invoke["invokeModel"]["body"]))


class TestModelIds:
    @pytest.mark.parametrize("model", [SONNET, f"us.{SONNET}", f"global.{SONNET}", PROFILE_ARN])
    async def test_ids_profiles_and_arns_are_routed_and_counted_with_the_models_200k_window(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None, model: str
    ) -> None:
        """A 25k-token conversation fits Claude Sonnet 4.5's 200k window whole (and the path keeps the id)."""
        fake = FakeBedrock(window=200_000)
        guard = await guard_before(aiohttp_server, model_map, fake)
        messages = _history(4, 3000)
        answer = await asyncio.to_thread(boto3_client(guard).converse, modelId=model, messages=messages)
        headers = answer["ResponseMetadata"]["HTTPHeaders"]
        assert 150_000 < int(headers["x-context-guard-budget"]) < 200_000 and headers["x-context-guard-removed"] == "0"
        assert fake.last("converse").json()["messages"] == messages and prompt_tokens({"messages": messages}) > 20_000
        assert fake.last("converse").model == model and fake.refused == []


class TestAuthentication:
    async def test_the_fake_bedrock_refuses_a_signature_not_made_with_the_guards_credentials(
        self, aiohttp_server: Any, guard_credentials: None
    ) -> None:
        fake = FakeBedrock()
        url = str((await aiohttp_server(fake.app())).make_url("")).rstrip("/")
        with pytest.raises(botocore.exceptions.ClientError) as refused:
            await asyncio.to_thread(
                boto3_client(url).converse, modelId=SONNET, messages=[{"role": "user", "content": [{"text": "hi"}]}]
            )
        assert refused.value.response["Error"]["Code"] == "InvalidSignatureException" and fake.received == []

    async def test_the_clients_signature_and_aws_headers_never_reach_bedrock(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None
    ) -> None:
        fake = FakeBedrock()
        guard = await guard_before(aiohttp_server, model_map, fake)
        await asyncio.to_thread(
            boto3_client(guard, aws_session_token="client-token").converse,
            modelId=SONNET, messages=[{"role": "user", "content": [{"text": "hi"}]}],
        )  # fmt: skip
        headers = fake.last("converse").headers
        assert "AKIDCLIENTDUMMY" not in headers["Authorization"] and headers["X-Amz-Security-Token"] == GUARD_TOKEN


class TestNothingUncounted:
    @pytest.mark.parametrize("path", ["/v1/async-invoke", "/v1/guardrail/g1/version/1/apply"])
    async def test_no_other_path_is_signed_and_forwarded_to_bedrock(
        self, aiohttp_server: Any, model_map: Any, guard_credentials: None, path: str
    ) -> None:
        """StartAsyncInvoke would run a model uncounted on the guard's credentials: pass-through
        sends nothing to a Bedrock upstream."""
        fake = FakeBedrock()
        guard = await guard_before(aiohttp_server, model_map, fake)
        async with aiohttp.ClientSession() as session, session.post(guard + path, json={"modelId": SONNET}) as answer:
            assert answer.status == 404
        assert fake.arrived == []
