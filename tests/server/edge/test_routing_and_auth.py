"""Routing models to upstreams, credentials, client keys, modes, and what the logs may say."""

from __future__ import annotations

import json
import sys

import aiohttp
import pytest

from proxy.config.upstreams import UpstreamSettings
from proxy.errors import UpstreamUnavailable
from proxy.server.edge.credentials import UpstreamAuth
from proxy.server.upstream.connection import request_headers
from tests.server.conftest import gateway_settings, long_conversation

HI = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


async def post(proxy, body: dict, headers: dict | None = None, path: str = "/v1/chat/completions"):
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.make_url(path), data=json.dumps(body), headers=headers or {}) as r:
            return r.status, await r.json(content_type=None), r.headers


class TestRouting:
    async def test_a_renamed_route_is_budgeted_for_the_model_that_serves_it(self, start_proxy, upstream, logs):
        settings = gateway_settings(
            upstream.url, routes=[{"match": "gemini-2.0-flash", "upstream": "fake", "rename": "google/gemini-2.5-pro"}]
        )
        proxy = await start_proxy(settings)
        status, _, headers = await post(proxy, {"model": "gemini-2.0-flash", "messages": long_conversation()})
        assert status == 200 and upstream.received[-1].json()["model"] == "google/gemini-2.5-pro"
        assert int(headers["x-context-guard-budget"]) > 900_000 and headers["x-context-guard-removed"] == "0"
        (event,) = logs.events("request")
        assert (event["model"], event["served_model"]) == ("gemini-2.0-flash", "google/gemini-2.5-pro")
        assert event["window_source"] == "model_map" and event["level"] == "info"

    async def test_models_go_to_the_first_matching_route_with_optional_rename(
        self, start_proxy, upstream, aiohttp_server
    ):
        from tests.support.upstream import FakeUpstream

        other = FakeUpstream()
        other_server = await aiohttp_server(other.app())
        settings = gateway_settings(
            upstream.url,
            upstreams={"fake": {"base_url": upstream.url}, "local": {"base_url": str(other_server.make_url("/v1"))}},
            routes=[
                {"match": "team-fast", "upstream": "local", "rename": "meta-llama/Llama-3.1-8B-Instruct"},
                {"match": "llama-*", "upstream": "local"},
                {"match": "*", "upstream": "fake"},
            ],
            models={"overrides": [{"match": "team-fast", "alias_of": "llama-3.1-8b", "context_window": 16384}]},
        )
        proxy = await start_proxy(settings)
        await post(proxy, {**HI, "model": "team-fast"})
        await post(proxy, {**HI, "model": "llama-3.1-70b"})
        await post(proxy, HI)
        assert [r.json()["model"] for r in other.received] == ["meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-70b"]
        assert [r.json()["model"] for r in upstream.received] == ["gpt-4o"]

    @pytest.mark.parametrize("size", [1_000, 200_000], ids=["parsed", "walked"])
    async def test_a_pass_through_body_goes_by_its_model_byte_for_byte_and_to_the_default_when_not_json(
        self, start_proxy, upstream, aiohttp_server, size
    ):
        """Small or large (read without building its values: proxy.wire.top_level_model), a body
        naming a routed model goes to that model's upstream, a body that is not JSON to the default
        upstream, each as sent."""
        from tests.support.upstream import FakeUpstream

        other = FakeUpstream()
        other_server = await aiohttp_server(other.app())
        settings = gateway_settings(
            upstream.url,
            upstreams={"fake": {"base_url": upstream.url}, "local": {"base_url": str(other_server.make_url("/v1"))}},
            routes=[{"match": "local-embed", "upstream": "local"}, {"match": "*", "upstream": "fake"}],
        )
        proxy = await start_proxy(settings)
        items = ", ".join(['{"text": "some words to embed", "n": [1, 2.5e3, null]}'] * (size // 50))
        routed = ('{"input": [' + items + '],\n "mod\\u0065l": "local\\u002dembed"}').encode()
        broken = routed[:-1]  # the same body cut short: not JSON
        headers = {"Content-Type": "application/json"}
        async with aiohttp.ClientSession() as session:
            for body in (routed, broken):
                async with session.post(proxy.make_url("/v1/embeddings"), data=body, headers=headers) as r:
                    assert r.status == 200
        assert [(r.path, r.body) for r in other.received] == [("/v1/embeddings", routed)]
        assert [(r.path, r.body) for r in upstream.received] == [("/v1/embeddings", broken)]

    async def test_the_client_cannot_choose_the_host(self, proxy, upstream):
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                proxy.make_url("/v1/chat/completions"),
                data=json.dumps(HI),
                headers={"Host": "evil.example.com", "X-Forwarded-Host": "evil.example.com"},
            ) as r,
        ):
            assert r.status == 200
        assert upstream.received[-1].headers["Host"].startswith("127.0.0.1:")


class TestUpstreamCredentials:
    async def test_the_client_authorization_passes_through_when_no_key_is_configured(self, proxy, upstream):
        await post(proxy, HI, {"Authorization": "Bearer sk-client-own"})
        assert upstream.received[-1].headers["Authorization"] == "Bearer sk-client-own"

    async def test_a_key_from_the_environment_replaces_it(self, start_proxy, upstream, monkeypatch):
        monkeypatch.setenv("FAKE_KEY", "sk-real-secret")
        proxy = await start_proxy(
            gateway_settings(upstream.url, upstreams={"fake": {"base_url": upstream.url, "api_key_env": "FAKE_KEY"}})
        )
        await post(proxy, HI, {"Authorization": "Bearer sk-client-own"})
        assert upstream.received[-1].headers["Authorization"] == "Bearer sk-real-secret"

    async def test_extra_headers_are_added_and_own_headers_never_leave(self, start_proxy, upstream):
        settings = gateway_settings(
            upstream.url,
            upstreams={"fake": {"base_url": upstream.url, "headers": {"x-goog-user-project": "p1"}}},
            server={"allow_mode_header": True},
        )
        proxy = await start_proxy(settings)
        await post(proxy, HI, {"x-context-guard-mode": "enforce"})
        headers = upstream.received[-1].headers
        assert headers["x-goog-user-project"] == "p1" and "x-context-guard-mode" not in {k.lower() for k in headers}

    async def test_a_token_command_is_run_once_and_refreshed_when_due(self, tmp_path):
        counter = tmp_path / "n"
        script = tmp_path / "token.py"
        script.write_text(
            f"import pathlib; p = pathlib.Path({str(counter)!r}); n = int(p.read_text()) + 1 if p.exists() else 1; "
            "p.write_text(str(n)); print(f'ya29.token-{n}')"
        )
        now = [0.0]
        auth = UpstreamAuth(
            UpstreamSettings(
                name="vertex", base_url="https://x/v1", token_command=f"{sys.executable} {script}", token_refresh_seconds=3000
            ),
            clock=lambda: now[0],
        )
        assert await auth.header("Bearer client", False) == "Bearer ya29.token-1"
        assert await auth.header(None, False) == "Bearer ya29.token-1"
        now[0] = 3001
        assert await auth.header(None, False) == "Bearer ya29.token-2"

    async def test_a_token_file_is_read(self, tmp_path):
        (tmp_path / "token").write_text("ya29.from-file\n")
        auth = UpstreamAuth(UpstreamSettings(name="vertex", base_url="https://x/v1", token_file=str(tmp_path / "token")))
        assert await auth.header(None, False) == "Bearer ya29.from-file"

    async def test_a_failing_token_command_is_a_generic_502_and_its_reason_goes_to_the_log(self, tmp_path, logs):
        auth = UpstreamAuth(
            UpstreamSettings(
                name="vertex",
                base_url="https://x/v1",
                token_command=f"{sys.executable} -c 'import sys; print(\"secret\"); sys.exit(3)'",
            )
        )
        with pytest.raises(UpstreamUnavailable, match="operator's log") as caught:
            await auth.header(None, False)
        assert "secret" not in str(caught.value) and "exited" not in str(caught.value)
        [event] = logs.events("token_refresh_failed")
        assert "exited with 3" in event["reason"] and "secret" not in logs.text


class TestClientKeys:
    async def test_requests_without_a_valid_client_key_get_401(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url, server={"client_keys": ["cg-team-key"]}))
        status, payload, _ = await post(proxy, HI, {"Authorization": "Bearer wrong"})
        assert status == 401 and payload["error"]["code"] == "invalid_api_key"
        assert upstream.received == []

    async def test_the_client_key_is_never_forwarded(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url, server={"client_keys": ["cg-team-key"]}))
        status, _, _ = await post(proxy, HI, {"Authorization": "Bearer cg-team-key"})
        assert status == 200 and "Authorization" not in upstream.received[-1].headers

    async def test_health_and_metrics_need_no_key(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url, server={"client_keys": ["k"]}))
        async with aiohttp.ClientSession() as session, session.get(proxy.make_url("/healthz")) as r:
            assert r.status == 200


class TestModes:
    async def test_dry_run_forwards_unchanged_and_reports_what_it_would_remove(self, start_proxy, upstream, logs):
        proxy = await start_proxy(gateway_settings(upstream.url, trim={"mode": "dry_run"}))
        body = {"model": "gpt-4", "messages": long_conversation()}
        status, _, headers = await post(proxy, body)
        assert status == 200 and upstream.received[-1].json() == body
        assert int(headers["x-context-guard-removed"]) > 0 and headers["x-context-guard-mode"] == "dry_run"
        assert logs.events("request")[0]["outcome"] == "dry_run_trimmed"

    async def test_off_forwards_without_counting(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url, trim={"mode": "off"}))
        status, _, headers = await post(proxy, {"model": "gpt-4", "messages": long_conversation()})
        assert status == 200 and "x-context-guard-tokens-before" not in headers

    async def test_mode_per_model_from_the_config(self, start_proxy, upstream):
        settings = gateway_settings(upstream.url, models={"overrides": [{"match": "gpt-4", "mode": "dry_run"}]})
        proxy = await start_proxy(settings)
        _, _, headers = await post(proxy, {"model": "gpt-4", "messages": long_conversation()})
        assert headers["x-context-guard-mode"] == "dry_run"

    async def test_mode_per_request_only_when_the_config_allows_it(self, start_proxy, upstream):
        body = {"model": "gpt-4", "messages": long_conversation()}
        closed = await start_proxy(gateway_settings(upstream.url))
        _, _, headers = await post(closed, body, {"x-context-guard-mode": "off"})
        assert headers["x-context-guard-mode"] == "enforce"
        opened = await start_proxy(gateway_settings(upstream.url, server={"allow_mode_header": True}))
        _, _, headers = await post(opened, body, {"x-context-guard-mode": "dry_run"})
        assert headers["x-context-guard-mode"] == "dry_run"
        status, payload, _ = await post(opened, body, {"x-context-guard-mode": "sometimes"})
        assert status == 400 and payload["error"]["param"] == "x-context-guard-mode"


class TestLogPrivacy:
    async def test_logs_hold_neither_content_nor_keys(self, start_proxy, upstream, logs, monkeypatch):
        monkeypatch.setenv("FAKE_KEY", "sk-real-secret")
        proxy = await start_proxy(
            gateway_settings(upstream.url, upstreams={"fake": {"base_url": upstream.url, "api_key_env": "FAKE_KEY"}})
        )
        messages = long_conversation()
        messages[1]["content"] = "my password is hunter2 " + messages[1]["content"]
        await post(proxy, {"model": "gpt-4", "messages": messages}, {"Authorization": "Bearer sk-client-secret"})
        assert logs.events("request")[0]["removed"]
        for secret in ("hunter2", "sk-real-secret", "sk-client-secret", "water cycle"):
            assert secret not in logs.text

    async def test_operators_can_opt_in_to_short_previews(self, start_proxy, upstream, logs):
        proxy = await start_proxy(gateway_settings(upstream.url, log={"content_preview_chars": 12}))
        await post(proxy, {"model": "gpt-4", "messages": long_conversation()})
        first = logs.events("request")[0]["removed"][0]  # the first message dropped after the opening
        assert first["preview"].startswith("Question ") and len(first["preview"]) == 12


class TestKeyHeadersByKind:
    @pytest.mark.parametrize(("kind", "header"), [("anthropic", "x-api-key"), ("azure", "api-key")])
    def test_an_injected_key_goes_in_the_header_the_provider_reads(self, kind, header):
        upstream = UpstreamSettings(name="u", base_url="https://x/v1", kind=kind, api_key_env="K")
        headers = request_headers({"x-api-key": "client-own", "api-key": "client-own"}, upstream, "Bearer sk-real")
        assert headers[header] == "sk-real" and "Authorization" not in headers

    def test_anthropic_gets_a_version_header_unless_the_client_named_one(self):
        upstream = UpstreamSettings(name="u", base_url="https://x/v1", kind="anthropic")
        assert request_headers({}, upstream, None)["anthropic-version"] == "2023-06-01"
        assert request_headers({"anthropic-version": "2024-01-01"}, upstream, None)["anthropic-version"] == "2024-01-01"

    def test_other_kinds_get_a_bearer_token(self):
        upstream = UpstreamSettings(name="u", base_url="https://x/v1", kind="openai", api_key_env="K")
        assert request_headers({}, upstream, "Bearer sk-real")["Authorization"] == "Bearer sk-real"
