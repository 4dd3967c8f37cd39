"""One client cannot make the guard misjudge another's chain.

The ledger of what the provider holds is keyed by the client's credential: an id a client names
is looked up only among the answers that client was given, and entries are written only from the
provider's own answers to that client's requests. So an attacker that names a victim's response
id learns nothing of its size through the guard's headers (the guard asks the provider with the
attacker's own credential, and the provider refuses it), and nothing an attacker does changes how
the victim's next call is counted."""

# ruff: noqa: F811  # fixtures imported from tests/server/conftest.py, named again as parameters

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from proxy.config.settings import settings_from_dict
from tests.server.conftest import logs, start_proxy  # noqa: F401  # fixtures (logs: start_proxy needs it)
from tests.support.upstream import FakeUpstream

MODEL = "gpt-4o"


def text(turn: int, words: int) -> str:
    return f"Turn {turn}. " + " ".join(f"item{turn}x{i}" for i in range(words))


@pytest.fixture
async def provider(aiohttp_server: Any) -> FakeUpstream:
    return await FakeUpstream(every_shape=True).served(aiohttp_server)


async def call(proxy: Any, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        async with session.post(proxy.make_url("/v1/responses"), json={"model": MODEL, **body}) as r:
            return r.status, await r.json(), dict(r.headers)


async def chain(proxy: Any, key: str, turns: int, words: int) -> str:
    previous: str | None = None
    for turn in range(turns):
        body: dict[str, Any] = {"input": text(turn, words), "max_output_tokens": 100}
        if previous is not None:
            body["previous_response_id"] = previous
        status, answer, _ = await call(proxy, key, body)
        assert status == 200
        previous = answer["id"]
    assert previous is not None
    return previous


class TestAnotherClientsChain:
    async def test_naming_it_reveals_nothing_of_its_size(self, start_proxy, provider):
        upstream = {"base_url": provider.url, "kind": "openai", "read_timeout": 10, "connect_timeout": 2}
        proxy = await start_proxy(settings_from_dict({"upstreams": {"openai": upstream}}, "t.yaml", {}))
        victims = await chain(proxy, "victim-key", 3, 1_500)
        status, _, headers = await call(proxy, "attacker-key", {"input": "hi", "previous_response_id": victims})
        assert status == 404  # the provider's own refusal of an id that is not the attacker's
        assert (headers["x-context-guard-held"], headers["x-context-guard-count"]) == ("unknown", "incomplete")
        assert int(headers["x-context-guard-tokens-before"]) < 100  # the victim's thousands are not in it

    async def test_nothing_an_attacker_does_changes_how_the_victim_is_counted(self, start_proxy, provider):
        upstream = {"base_url": provider.url, "kind": "openai", "read_timeout": 10, "connect_timeout": 2}
        proxy = await start_proxy(settings_from_dict({"upstreams": {"openai": upstream}}, "t.yaml", {}))
        victims = await chain(proxy, "victim-key", 3, 1_500)
        # The attacker names the victim's id, builds chains of its own, and names ids it guesses.
        await call(proxy, "attacker-key", {"input": "tiny", "previous_response_id": victims})
        mine = await chain(proxy, "attacker-key", 3, 5)
        for guess in (victims, mine, "resp_1", "resp_99"):
            await call(proxy, "attacker-key", {"input": "tiny", "previous_response_id": guess})
        status, _, headers = await call(
            proxy, "victim-key", {"input": text(9, 100), "previous_response_id": victims, "max_output_tokens": 100}
        )
        assert status == 200 and headers["x-context-guard-held"] == "ledger"
        counted, provider_count = int(headers["x-context-guard-tokens-before"]), provider.stored.counted[-1]
        assert provider_count * 0.98 <= counted <= provider_count * 1.3
