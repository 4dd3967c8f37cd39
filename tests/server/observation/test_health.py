"""/livez, /readyz and /healthz on a real proxy in front of a real (fake) upstream."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from bench.processes import free_port  # a port nothing listens on
from proxy.config.settings import settings_from_dict
from proxy.errors import ConfigError
from proxy.server.observation.health import HEALTH, Reachability, ReadinessOptions
from proxy.server.upstream.connection import UPSTREAM_POOL
from tests.server.conftest import gateway_settings


async def get(server: Any, path: str, **headers: str) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(server.make_url(path), headers=headers) as r:
        return r.status, await r.json()


async def ready(server: Any) -> tuple[int, dict[str, Any]]:
    """/readyz after a round of upstream probes of our own (the background one may not have run yet)."""
    await server.app[HEALTH].reachability.probe_all()
    return await get(server, "/readyz")


class TestLiveness:
    async def test_livez_says_the_process_serves(self, proxy):
        assert await get(proxy, "/livez") == (200, {"status": "ok"})

    async def test_healthz_is_liveness_with_the_version(self, proxy):
        status, body = await get(proxy, "/healthz")
        assert status == 200 and body["status"] == "ok" and body["version"]


class TestReadiness:
    async def test_ready_once_the_upstream_is_reached(self, proxy):
        status, body = await ready(proxy)
        assert status == 200 and body == {"status": "ready", "config": "test.yaml"}

    async def test_an_unreachable_upstream_is_503_naming_it(self, start_proxy):
        server = await start_proxy(gateway_settings(f"http://127.0.0.1:{free_port()}/v1"))
        status, body = await ready(server)
        assert status == 503 and body["status"] == "not ready"
        assert "upstream 'fake' not reached" in body["reasons"][0] and "refused" in body["reasons"][0].lower()

    async def test_upstream_reachability_can_be_left_out(self, start_proxy, model_map):
        from aiohttp.test_utils import TestServer

        from proxy.server.backends.models import Models
        from proxy.server.process.app import create_app

        settings = gateway_settings(f"http://127.0.0.1:{free_port()}/v1", readiness={"require_upstreams": False})
        app = create_app(settings, Models(settings, model_map))
        async with TestServer(app) as server:
            assert (await get(server, "/readyz"))[0] == 200

    async def test_draining_is_503_at_once(self, proxy):
        await ready(proxy)
        proxy.app[HEALTH].draining = True
        status, body = await get(proxy, "/readyz")
        assert status == 503 and body["reasons"] == ["draining: shutting down"]

    async def test_probes_need_no_client_key(self, start_proxy, upstream):
        server = await start_proxy(gateway_settings(upstream.url, server={"client_keys": ["secret"]}))
        assert (await ready(server))[0] == 200
        assert (await get(server, "/livez"))[0] == 200
        async with aiohttp.ClientSession() as session, session.get(server.make_url("/v1/models")) as r:
            assert r.status == 401


class TestReachability:
    def test_an_upstream_never_checked_is_reported_as_such(self):
        reach = Reachability({"a": "http://127.0.0.1:1/v1"}, ReadinessOptions())
        assert reach.problems() == ["upstream 'a' not reached in the last 30 s: not checked yet"]

    def test_a_response_counts_as_reached_until_it_is_too_old(self):
        now = [100.0]
        reach = Reachability({"a": "https://example.invalid/v1"}, ReadinessOptions(), clock=lambda: now[0])
        reach.saw("a")
        now[0] += 29
        assert reach.problems() == []
        now[0] += 2
        assert reach.problems() == ["upstream 'a' not reached in the last 30 s"]

    def test_an_answer_through_the_upstream_pool_counts_as_reached_until_it_is_too_old(self):
        """What the upstream call writes into the pool's `answered` is read beside the probes."""
        now, answered = [100.0], {}
        reach = Reachability({"a": "https://example.invalid/v1"}, ReadinessOptions(), lambda: now[0], answered)
        answered["a"] = now[0]
        now[0] += 29
        assert reach.problems() == []
        now[0] += 2
        assert reach.problems() == ["upstream 'a' not reached in the last 30 s"]

    async def test_a_request_forwarded_through_the_guard_marks_its_upstream_answered(self, proxy):
        """The upstream call writes the answer's time where readiness reads it."""
        assert "fake" not in proxy.app[UPSTREAM_POOL].answered
        async with aiohttp.ClientSession() as session:
            body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(proxy.make_url("/v1/chat/completions"), json=body) as response:
                assert response.status == 200
        assert "fake" in proxy.app[UPSTREAM_POOL].answered

    async def test_a_probe_skips_upstreams_seen_within_the_interval(self):
        reach = Reachability({"a": f"http://127.0.0.1:{free_port()}"}, ReadinessOptions())
        reach.saw("a")
        await reach.probe_all()  # would record "refused" had it connected
        assert reach.problems() == []

    def test_a_reload_keeps_what_is_known_of_remaining_upstreams(self):
        reach = Reachability({"a": "http://127.0.0.1:1", "b": "http://127.0.0.1:2"}, ReadinessOptions())
        reach.saw("a")
        reach.replace_upstreams({"a": "http://127.0.0.1:1", "c": "http://127.0.0.1:3"})
        assert [p.split("'")[1] for p in reach.problems()] == ["c"]


class TestReadinessOptions:
    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"probe_interval_seconds": 0}, "cg.yaml: readiness.probe_interval_seconds: must be greater than 0"),
            ({"probe_timeout_seconds": 61}, "cg.yaml: readiness.probe_timeout_seconds: must be at most 60"),
            ({"reachable_within_seconds": 1}, r"cg.yaml: readiness.reachable_within_seconds: must be at least readiness.probe_interval_seconds \(5.0\)"),
        ],
    )
    def test_a_bad_value_is_refused_naming_the_key(self, options, message):
        with pytest.raises(ConfigError, match=message):
            settings_from_dict({"readiness": options}, "cg.yaml", {})
