"""The request bodies a serving process holds at once are bounded, in all and per client
(`proxy.server.edge.body`): past a client's share its body gets 429, past the process's
budget 503, each in the API's own shape with `Retry-After`; compressed bytes and what they inflate
to are both counted, and everything a request held goes back when it ends, however it ends."""

from __future__ import annotations

import asyncio
import gzip
import json

import pytest

from proxy.config.schema import SchemaError
from proxy.config.settings import ServerSettings
from proxy.errors import Overloaded, TooManyRequests
from proxy.server.edge.body import BODY_BUDGET, BodyBudget, BodyLimits
from tests.server.conftest import gateway_settings
from tests.server.raw_http import raw_request

MiB = 1024 * 1024
CHAT = "/v1/chat/completions"


def chat_body(size: int) -> bytes:
    """A chat body of about `size` bytes of prose."""
    text = ("The river runs to the sea while the fox sleeps. " * (size // 48 + 1))[:size]
    return json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}).encode()


def small_limits(**server: object) -> dict[str, object]:
    """A server whose body limit is 1 MiB, holding 3 MiB of bodies at once, 2 MiB for one client."""
    return {"max_body_bytes": MiB, "body_memory_bytes": 3 * MiB, "client_body_memory_bytes": 2 * MiB, **server}


class TestBodyBudget:
    def test_a_client_past_its_share_is_refused_with_429_and_others_are_not(self):
        budget = BodyBudget(BodyLimits(total=100, per_client=60))
        budget.hold("a").take(60)
        with pytest.raises(TooManyRequests) as refused:
            budget.hold("a").take(1)
        assert refused.value.status == 429 and refused.value.headers["Retry-After"] == "2"
        budget.hold("b").take(40)
        assert budget.held == 100 and budget.held_by("a") == 60

    def test_past_the_total_any_client_is_refused_with_503(self):
        budget = BodyBudget(BodyLimits(total=100, per_client=60))
        budget.hold("a").take(60)
        with pytest.raises(Overloaded) as refused:
            budget.hold("b").take(41)
        assert refused.value.status == 503 and "Retry-After" in refused.value.headers
        assert budget.held_by("b") == 0 and budget.refused == 1

    def test_a_release_gives_back_all_the_request_held_and_only_once(self):
        budget = BodyBudget(BodyLimits(total=100, per_client=60))
        held = budget.hold("a")
        held.take(30)
        held.take(30)
        other = budget.hold("a")
        other.take(0)
        held.release()
        held.release()
        assert budget.held == 0 and budget.held_by("a") == 0
        other.take(60)
        assert budget.held == 60


class TestTheSettings:
    def test_unset_the_budget_is_three_bodies_of_the_limit_and_a_client_two(self):
        assert ServerSettings().body_memory == (3 * 32 * MiB, 2 * 32 * MiB)
        assert ServerSettings(max_body_bytes=MiB).body_memory == (3 * MiB, 2 * MiB)

    def test_a_share_that_cannot_hold_a_compressed_body_and_its_inflation_is_refused(self):
        with pytest.raises(SchemaError) as refused:
            ServerSettings(max_body_bytes=MiB, client_body_memory_bytes=MiB)
        assert refused.value.location == ("client_body_memory_bytes",)

    def test_a_share_over_the_total_is_refused(self):
        with pytest.raises(SchemaError) as refused:
            ServerSettings(max_body_bytes=MiB, body_memory_bytes=2 * MiB, client_body_memory_bytes=3 * MiB)
        assert "at most body_memory_bytes" in refused.value.message


class TestOverSockets:
    async def test_a_body_past_the_clients_share_gets_429_in_openai_shape_before_it_is_read(
        self, start_proxy, upstream
    ):
        proxy = await start_proxy(gateway_settings(upstream.url, server=small_limits()))
        budget = proxy.app[BODY_BUDGET]
        holder = budget.hold("peer:127.0.0.1")
        holder.take(2 * MiB - 1024)  # another request of this client, in flight
        response = await raw_request(proxy.port, "POST", CHAT, chat_body(4096), {"Content-Type": "application/json"})
        assert response.status == 429 and response.headers["Retry-After"] == "2"
        error = response.json()["error"]
        assert error["code"] == "rate_limit_exceeded" and "share" in error["message"]
        assert upstream.received == []
        holder.release()
        response = await raw_request(proxy.port, "POST", CHAT, chat_body(4096), {"Content-Type": "application/json"})
        assert response.status == 200 and budget.held == 0

    async def test_a_body_past_the_process_budget_gets_503_in_anthropics_shape(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url, server=small_limits()))
        proxy.app[BODY_BUDGET].hold("key:someone-else").take(2 * MiB)
        proxy.app[BODY_BUDGET].hold("key:a-third").take(MiB - 1024)
        body = json.dumps(
            {"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "x" * 4096}]}
        )
        response = await raw_request(
            proxy.port, "POST", "/v1/messages", body.encode(), {"Content-Type": "application/json", "x-api-key": "k"}
        )
        assert response.status == 503 and response.headers["Retry-After"] == "2"
        assert response.json()["type"] == "error" and response.json()["error"]["type"] == "overloaded_error"

    async def test_what_a_small_upload_inflates_to_is_counted_and_refused_with_429_not_413(self, start_proxy, upstream):
        """A body within the limit (0.9 MiB inflated from a few KB) from a client that already holds
        1.5 MiB of its 2 MiB share: its inflation is refused as it grows, and what it took given back."""
        proxy = await start_proxy(gateway_settings(upstream.url, server=small_limits()))
        budget = proxy.app[BODY_BUDGET]
        holder = budget.hold("peer:127.0.0.1")
        holder.take(MiB + MiB // 2)
        upload = gzip.compress(chat_body(900 * 1024))
        assert len(upload) < 64 * 1024
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        response = await raw_request(proxy.port, "POST", CHAT, upload, headers)
        assert response.status == 429 and response.json()["error"]["code"] == "rate_limit_exceeded"
        assert budget.held == MiB + MiB // 2  # the refused request gave back what it took
        holder.release()
        assert (await raw_request(proxy.port, "POST", CHAT, upload, headers)).status == 200

    async def test_a_client_that_hangs_up_half_way_gives_back_what_it_held_at_once(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url, server=small_limits()))
        budget = proxy.app[BODY_BUDGET]
        _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        head = f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {MiB}\r\n\r\n"
        writer.write(head.encode() + b'{"model": "gpt-4o", "messages": [' + b" " * 65536)
        await writer.drain()
        async with asyncio.timeout(10):
            while budget.held != MiB:  # the announced length is taken before a byte is read
                await asyncio.sleep(0.01)
            writer.close()
            await writer.wait_closed()
            while budget.held:
                await asyncio.sleep(0.01)
        assert budget.held_by("peer:127.0.0.1") == 0 and upstream.received == []
