"""A serving process's life, in process: requests in flight, draining, reloading, its options."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from proxy.config.settings import Settings
from proxy.config.source import SettingsSource
from proxy.core.models.model_registry import TokenizerSpec
from proxy.errors import ConfigError
from proxy.server.process.app import DRAIN, Drain
from proxy.server.process.lifecycle import ServerOptions, available_cores, load_models, load_vocabularies, reload_config
from proxy.server.request.gateway import GATEWAY
from tests.server.conftest import gateway_settings
from tests.support.upstream import FakeUpstream

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


async def post(server: Any, body: dict[str, Any] = CHAT) -> aiohttp.ClientResponse:
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.make_url("/v1/chat/completions"), json=body) as r,
    ):
        await r.read()
        return r


class TestDrain:
    async def test_a_stream_is_in_flight_until_it_ends(self, proxy, upstream):
        upstream.chunk_delay, upstream.stream_chunks = 0.05, 10
        drain = proxy.app[DRAIN]
        request = asyncio.create_task(post(proxy, {**CHAT, "stream": True}))
        await asyncio.wait_for(upstream.stream_started.wait(), 5)
        assert drain.in_flight == 1
        assert await drain.wait_idle(0.01) is False
        response = await request
        assert response.status == 200 and await drain.wait_idle(1) and drain.in_flight == 0

    async def test_while_draining_each_response_closes_its_connection(self, proxy):
        proxy.app[DRAIN].draining = True
        response = await post(proxy)
        assert response.status == 200 and response.headers["Connection"] == "close"
        assert proxy.app[DRAIN].served_while_draining == 1

    async def test_an_idle_drain_waits_for_nothing(self):
        assert await Drain().wait_idle(0) is True


class TestReload:
    async def test_a_good_config_replaces_the_gateway_and_keeps_what_was_learned(self, proxy, aiohttp_server, logs):
        second = FakeUpstream()
        second_server = await aiohttp_server(second.app())
        old = proxy.app[GATEWAY]
        new_settings = gateway_settings(str(second_server.make_url("/v1")))
        assert await reload_config(proxy.app, lambda: new_settings) is True
        new = proxy.app[GATEWAY]
        assert new.settings is new_settings and new.store is old.store and new.metrics is old.metrics
        assert (await post(proxy)).status == 200 and len(second.received) == 1
        assert logs.events("reloaded")[0]["upstreams"] == {"fake": str(second_server.make_url("/v1"))}

    async def test_a_bad_config_is_refused_and_the_old_one_kept(self, proxy, upstream, logs):
        old = proxy.app[GATEWAY]

        def broken() -> Settings:
            raise ConfigError("must be a whole number, not 'lots'", source="new.yaml", key="server.port")

        assert await reload_config(proxy.app, broken) is False
        assert proxy.app[GATEWAY] is old and (await post(proxy)).status == 200 and upstream.received
        refused = logs.events("reload_refused")[0]
        assert refused["reason"] == "new.yaml: server.port: must be a whole number, not 'lots'"
        assert refused["level"] == "error" and refused["kept"] == "test.yaml"

    async def test_a_changed_port_is_reported_as_needing_a_restart(self, proxy, upstream, logs):
        settings = gateway_settings(upstream.url, server={"port": 9999})
        await reload_config(proxy.app, lambda: settings)
        assert logs.events("reloaded")[0]["needs_restart"] == ["server.port"]


class TestSettingsSource:
    def test_host_and_port_come_from_the_environment_over_the_file(self):
        settings = SettingsSource().load({"HOST": "0.0.0.0", "PORT": "9000"})
        assert (settings.server.host, settings.server.port) == ("0.0.0.0", 9000)

    def test_flags_come_over_the_environment(self):
        settings = SettingsSource(host="127.0.0.2", port=7000).load({"HOST": "0.0.0.0", "PORT": "9000"})
        assert (settings.server.host, settings.server.port) == ("127.0.0.2", 7000)

    def test_a_bad_port_in_the_environment_names_the_variable(self):
        with pytest.raises(ConfigError, match=r"environment: PORT: must be a whole number, not 'http'"):
            SettingsSource().load({"PORT": "http"})

    def test_upstream_sends_every_route_to_one_url(self):
        settings = SettingsSource(upstream="http://vllm:8000/v1").load({})
        assert settings.upstreams["cli"].base_url == "http://vllm:8000/v1"

    def test_a_bad_upstream_names_the_flag(self):
        with pytest.raises(ConfigError, match="--upstream: 'vllm:8000' must start with http"):
            SettingsSource(upstream="vllm:8000").load({})


class TestServerOptions:
    def test_by_default_there_is_one_worker_per_available_core(self):
        assert ServerOptions().worker_count() == available_cores() >= 1

    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"workers": 0}, "server.workers must be between 1 and 256"),
            ({"drain_delay_seconds": -1}, "server.drain_delay_seconds must be between 0 and 600"),
            ({"shutdown_grace_seconds": 4000}, "server.shutdown_grace_seconds must be between 0 and 3600"),
        ],
    )
    def test_a_bad_value_is_refused_naming_the_key(self, options, message):
        with pytest.raises(ValueError, match=message):
            ServerOptions(**options)


class TestVocabulariesAtStart:
    """What a process loads before it is ready (`tokenizers.preload`): the configured models', then
    what the setting names, so that no request's first use of them holds the event loop."""

    def test_auto_loads_openais_encodings_for_a_generic_upstream(self):
        guard = load_models(gateway_settings("http://127.0.0.1:9/v1"))
        assert guard.tokenizers.loaded == ()
        load_vocabularies(guard)
        loaded = set(guard.tokenizers.loaded)
        assert {TokenizerSpec("tiktoken", "o200k_base"), TokenizerSpec("tiktoken", "cl100k_base")} <= loaded
        assert TokenizerSpec("vocab", "llama3") not in loaded

    def test_a_named_model_loads_its_familys_vocabulary_too(self):
        settings = gateway_settings("http://127.0.0.1:9/v1", tokenizers={"preload": ["llama-3.1-8b-instruct"]})
        guard = load_models(settings)
        load_vocabularies(guard)
        assert TokenizerSpec("vocab", "llama3") in guard.tokenizers.loaded
