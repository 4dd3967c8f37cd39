"""The gateway end to end: the official openai SDK -> context-guard -> a real upstream."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from tests.server.conftest import gateway_settings, long_conversation


def sdk(proxy, **kwargs) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key="sk-client", max_retries=0, **kwargs)


class TestTrimmingThroughTheSDK:
    async def test_a_long_gpt4_conversation_arrives_fitting_its_budget_with_removals_reported(
        self, proxy, upstream, logs
    ):
        messages = long_conversation()
        raw = await sdk(proxy).chat.completions.with_raw_response.create(model="gpt-4", messages=messages)
        completion = raw.parse()
        assert completion.choices[0].message.content == "Hello from upstream."

        sent = upstream.received[-1].json()
        before, after = (
            int(raw.headers["x-context-guard-tokens-before"]),
            int(raw.headers["x-context-guard-tokens-after"]),
        )
        budget = int(raw.headers["x-context-guard-budget"])
        assert before > 8192 and after <= budget == 8192 - 1228 - 410
        assert int(raw.headers["x-context-guard-removed"]) > 0 and raw.headers["x-request-id"]
        assert sent["messages"][0] == messages[0] and sent["messages"][-1] == messages[-1]
        assert len(sent["messages"]) < len(messages)

        (event,) = logs.events("request")
        assert event["outcome"] == "trimmed" and event["tokens_before"] == before and event["tokens_after"] == after
        assert event["removed_count"] == int(raw.headers["x-context-guard-removed"])
        first = event["cut"]["first_kept"] - event["removed_count"]  # the span dropped after the opening
        assert event["removed"] == [
            {
                "what": f"messages {first}-{first + event['removed_count'] - 1}",
                "count": event["removed_count"],
                "kind": "dropped",
                "tokens": event["removed_tokens"],
                "strategy": "drop_oldest_turns",
            }
        ]
        assert event["request_id"] == raw.headers["x-request-id"] and event["upstream"] == "fake"
        assert {"count_ms", "trim_ms", "upstream_ms", "total_ms"} <= set(event)

    async def test_streaming_relays_every_chunk(self, proxy, upstream):
        stream = await sdk(proxy).chat.completions.create(model="gpt-4", messages=long_conversation(), stream=True)
        parts = [chunk.choices[0].delta.content async for chunk in stream]
        assert parts == [f"part{i} " for i in range(5)]
        assert upstream.received[-1].json()["stream"] is True

    async def test_tool_calls_and_results_survive_trimming_together(self, proxy, upstream):
        messages = long_conversation(40)
        messages[3:3] = [
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"q": "rain"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "rain is water"},
        ]
        tools = [
            {
                "type": "function",
                "function": {
                    "name": "lookup",
                    "description": "Look something up.",
                    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
                },
            }
        ]
        await sdk(proxy).chat.completions.create(model="gpt-4", messages=messages, tools=tools, tool_choice="auto")
        sent = upstream.received[-1].json()
        ids = [m.get("tool_call_id") for m in sent["messages"] if m["role"] == "tool"]
        calls = [c["id"] for m in sent["messages"] for c in m.get("tool_calls") or []]
        assert ids == calls and sent["tools"] == tools and sent["tool_choice"] == "auto"

    async def test_a_refused_request_is_logged_too(self, proxy, logs):
        async with aiohttp.ClientSession() as session:
            async with session.post(proxy.make_url("/v1/chat/completions"), data=b"{oops") as r:
                assert r.status == 400
        (event,) = logs.events("request")
        assert (event["outcome"], event["status"], event["error"]) == ("refused", 400, "invalid_request")

    async def test_whole_responses_keep_their_length_and_the_upstream_request_id(self, proxy, upstream):
        async with aiohttp.ClientSession() as session:
            headers = {"x-request-id": "client-chosen-id"}
            async with session.post(proxy.make_url("/v1/models"), data=b"{}", headers=headers) as r:
                assert r.headers["Content-Length"] == "2" and r.headers["x-request-id"] == "client-chosen-id"

    async def test_the_sync_sdk_works_too(self, proxy, upstream):
        client = openai.OpenAI(base_url=str(proxy.make_url("/v1")), api_key="sk-client", max_retries=0)

        def call() -> str:
            return (
                client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
                .choices[0]
                .message.content
            )

        assert await asyncio.to_thread(call) == "Hello from upstream."


class TestUntouchedRequests:
    async def test_a_request_that_fits_arrives_byte_for_byte(self, proxy, upstream):
        raw = b'{"model": "gpt-4o",   "messages": [{"role": "user", "content": "hi \\u00e9"}], "x_unknown": {"keep": [1, 2.50]}}'
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                proxy.make_url("/v1/chat/completions"), data=raw, headers={"Content-Type": "application/json"}
            ) as r,
        ):
            assert r.status == 200
            assert r.headers["x-context-guard-removed"] == "0"
        assert upstream.received[-1].body == raw

    async def test_fields_we_do_not_know_survive_trimming(self, proxy, upstream):
        body = {
            "model": "gpt-4",
            "messages": long_conversation(),
            "logit_bias": {"50256": -100},
            "vendor": {"x": [1]},
            "seed": 7,
            "big": 123456789012345678901234567890,
        }
        async with aiohttp.ClientSession() as session:
            async with session.post(proxy.make_url("/v1/chat/completions"), data=json.dumps(body)) as r:
                assert r.status == 200 and int(r.headers["x-context-guard-removed"]) > 0
        sent = upstream.received[-1].json()
        assert {k: v for k, v in sent.items() if k != "messages"} == {k: v for k, v in body.items() if k != "messages"}


class TestPassThrough:
    @pytest.mark.parametrize(
        ("method", "path", "body", "content_type"),
        [
            ("GET", "/v1/models?limit=5&order=desc", b"", None),
            ("POST", "/v1/embeddings", b'{"model": "text-embedding-3-small", "input": "hello"}', "application/json"),
            ("POST", "/v1/responses", b'{"model": "gpt-4o", "input": "hi"}', "application/json"),
            ("POST", "/v1/audio/transcriptions", bytes(range(256)) * 64, "application/octet-stream"),
            ("DELETE", "/v1/files/file-123", b"", None),
        ],
    )
    async def test_arrives_unchanged_with_method_query_and_body(
        self, proxy, upstream, method, path, body, content_type
    ):
        headers = {"Content-Type": content_type} if content_type else {}
        async with aiohttp.ClientSession() as session:
            async with session.request(method, proxy.make_url(path), data=body or None, headers=headers) as r:
                assert r.status == 200 and await r.read() == (body or b"{}")
        received = upstream.received[-1]
        assert (received.method, received.body) == (method, body)
        assert received.path + (f"?{received.query}" if received.query else "") == path

    async def test_multipart_uploads_arrive_unchanged(self, proxy, upstream):
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", b'{"custom_id": "1"}\n', filename="batch.jsonl", content_type="application/jsonl")
        async with aiohttp.ClientSession() as session:
            async with session.post(proxy.make_url("/v1/files"), data=form) as r:
                assert r.status == 200
                sent_body = await r.read()
        received = upstream.received[-1]
        assert received.body == sent_body and b'filename="batch.jsonl"' in received.body
        assert received.headers["Content-Type"].startswith("multipart/form-data; boundary=")


class TestHealthAndMetrics:
    async def test_healthz(self, proxy):
        async with aiohttp.ClientSession() as session, session.get(proxy.make_url("/healthz")) as r:
            assert r.status == 200 and (await r.json())["status"] == "ok"

    async def test_metrics_count_requests_trims_and_tokens(self, proxy, upstream):
        await sdk(proxy).chat.completions.create(model="gpt-4", messages=long_conversation())
        async with aiohttp.ClientSession() as session, session.get(proxy.make_url("/metrics")) as r:
            text = await r.text()
        assert 'context_guard_requests_total{kind="chat",outcome="trimmed",status="2xx"} 1.0' in text
        assert 'context_guard_trims_total{model="gpt-4"} 1.0' in text
        assert (
            "context_guard_tokens_removed_total" in text
            and 'context_guard_duration_seconds_bucket{le="0.001",phase="count"}' in text
        )
        assert "_created" not in text and "process_resident_memory_bytes" in text

    async def test_metric_labels_stay_bounded_whatever_model_names_clients_send(self, proxy, upstream):
        for i in range(30):
            await sdk(proxy).chat.completions.create(model=f"made-up-{i}", messages=long_conversation(2))
        async with aiohttp.ClientSession() as session, session.get(proxy.make_url("/metrics")) as r:
            text = await r.text()
        assert "made-up" not in text


class TestBudgetNote:
    async def test_a_trimmed_chat_request_carries_a_factual_note_when_the_operator_asks(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url, trim={"budget_note": True}))
        raw = await sdk(proxy).chat.completions.with_raw_response.create(model="gpt-4", messages=long_conversation())
        sent = upstream.received[-1].json()["messages"]
        notes = [m for m in sent if m["role"] == "system" and "removed to fit the context window" in m["content"]]
        assert len(notes) == 1 and sent[0]["content"] == "You are a patient tutor."
        assert int(raw.headers["x-context-guard-tokens-after"]) <= int(raw.headers["x-context-guard-budget"])


class TestSummariesOfDroppedHistory:
    async def test_dropped_history_is_summarised_once_and_the_summary_reused_on_the_next_turn(
        self, start_proxy, upstream, logs
    ):
        trim = {"summarize_dropped": True, "summariser": {"upstream": "fake", "model": "summary-writer"}}
        proxy = await start_proxy(gateway_settings(upstream.url, trim=trim))
        messages = long_conversation()
        raw = await sdk(proxy).chat.completions.with_raw_response.create(model="gpt-4", messages=messages)
        calls = [r.json()["model"] for r in upstream.received]
        assert calls == ["summary-writer", "gpt-4"]
        sent = upstream.received[-1].json()["messages"]
        summaries = [m for m in sent if "Hello from upstream." in str(m.get("content"))]
        assert len(summaries) == 1 and sent[0]["content"] == "You are a patient tutor."
        assert int(raw.headers["x-context-guard-tokens-after"]) <= int(raw.headers["x-context-guard-budget"])
        assert logs.events("request")[-1]["summary"]["status"] == "produced"

        more = [*messages, {"role": "assistant", "content": "It scatters blue light."}, {"role": "user", "content": "And at sunset?"}]
        await sdk(proxy).chat.completions.create(model="gpt-4", messages=more)
        assert [r.json()["model"] for r in upstream.received][2:] == ["gpt-4"]  # no second summariser call
        assert logs.events("request")[-1]["summary"]["status"] == "reused"

    async def test_a_failing_summariser_falls_back_to_plain_dropping(self, start_proxy, upstream, logs):
        trim = {"summarize_dropped": True, "summariser": {"upstream": "fake", "model": "summary-writer"}}
        proxy = await start_proxy(gateway_settings(upstream.url, trim=trim))
        upstream.fail_with = (500, {"error": {"message": "down"}})
        status = None
        try:
            await sdk(proxy).chat.completions.create(model="gpt-4", messages=long_conversation())
        except openai.InternalServerError as exc:  # the fake fails the chat call too; the guard still sent it
            status = exc.status_code
        assert status == 500 and [r.json()["model"] for r in upstream.received] == ["summary-writer", "gpt-4"]
        assert logs.events("request")[-1]["summary"]["status"] == "failed"

    async def test_in_dry_run_no_summary_is_asked_for(self, start_proxy, upstream, logs):
        trim = {"mode": "dry_run", "summarize_dropped": True, "summariser": {"upstream": "fake", "model": "summary-writer"}}
        proxy = await start_proxy(gateway_settings(upstream.url, trim=trim))
        await sdk(proxy).chat.completions.create(model="gpt-4", messages=long_conversation())
        assert [r.json()["model"] for r in upstream.received] == ["gpt-4"]
        assert logs.events("request")[-1]["outcome"] == "dry_run_trimmed"
