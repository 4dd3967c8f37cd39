"""A body sent again as it was is the request parsed the last time those bytes came to that
endpoint: not read, not checked again, as long as the prefix reader keeps the body."""

from __future__ import annotations

import gc
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from bench.conversations import agent_conversation
from proxy.apis.registry import AdapterRegistry, Endpoint
from proxy.wire.readers import PARSES_PER_BODY, BodyReaders, KeptPerBody, parsed_request

REGISTRY = AdapterRegistry()
CHAT = REGISTRY.endpoint_for("/v1/chat/completions")
assert CHAT is not None


def conversation(question: str = "And now?") -> bytes:
    body = agent_conversation(2000)
    body["model"] = "gpt-4o"
    body["messages"].append({"role": "user", "content": question})
    return orjson.dumps(body)


@pytest.fixture
def gateway() -> Any:
    """What `parsed_request` is given of the gateway: the readers and the parses kept."""
    return SimpleNamespace(
        readers=BodyReaders(REGISTRY.adapters, prefix_memory_bytes=8 * 1024 * 1024), parses=KeptPerBody(PARSES_PER_BODY)
    )


@pytest.fixture
def parses_made(monkeypatch: pytest.MonkeyPatch) -> list[Endpoint]:
    """The endpoints whose adapter parsed a body (read, checked, built a `Parsed`)."""
    made: list[Endpoint] = []
    real = Endpoint.parse

    def parse(self: Endpoint, *args: Any, **kwargs: Any) -> Any:
        made.append(self)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Endpoint, "parse", parse)
    return made


def sent(gateway: Any, endpoint: Endpoint, raw: bytes) -> Any:
    """The handler's parse of `raw`, from its own copy of the bytes (as each request has)."""
    raw = bytes(bytearray(raw))
    return parsed_request(gateway.readers, gateway.parses, endpoint, raw, gateway.readers.match(endpoint.adapter, raw))


class TestResentParses:
    def test_a_body_sent_a_third_time_is_the_request_parsed_the_second_time(self, gateway, parses_made):
        raw = conversation()
        first, second, third = (sent(gateway, CHAT, raw) for _ in range(3))
        assert len(parses_made) == 2  # the first sending, and the first sending again
        assert third is second  # the very request
        assert third.body == first.body and third.message_hashes == first.message_hashes
        assert third.shared_messages == len(third.messages) and first.shared_messages == 0  # read whole, then known
        assert first.same_as is None and third.same_as is not None  # it names the body its plans are kept with

    def test_what_was_parsed_anew_is_not_kept(self, gateway, parses_made):
        sent(gateway, CHAT, conversation())
        sent(gateway, CHAT, conversation("Something else?"))  # a sibling: read where it is new
        assert len(gateway.parses) == 0 and len(parses_made) == 2

    def test_another_path_for_the_same_bytes_is_parsed_for_that_path(self, gateway, parses_made):
        deployment = REGISTRY.endpoint_for("/openai/deployments/team-4o/chat/completions")
        raw = conversation()
        for _ in range(3):
            chat, azure = sent(gateway, CHAT, raw), sent(gateway, deployment, raw)
        assert chat.model == "gpt-4o" and azure.model == "team-4o"
        # The chat path read the bytes new, then sent again; the deployment's first were sent again.
        assert parses_made.count(CHAT) == 2 and parses_made.count(deployment) == 1 and len(gateway.parses) == 2

    def test_a_few_paths_at_most_are_kept_per_body(self, gateway):
        raw = conversation()
        for name in range(PARSES_PER_BODY + 2):
            endpoint = REGISTRY.endpoint_for(f"/openai/deployments/d{name}/chat/completions")
            for _ in range(2):
                assert sent(gateway, endpoint, raw).model == f"d{name}"
        assert len(gateway.parses) == PARSES_PER_BODY

    def test_a_kept_request_goes_when_the_reader_lets_its_body_go(self):
        gateway = SimpleNamespace(
            readers=BodyReaders(REGISTRY.adapters, prefix_memory_bytes=4 * len(conversation())),
            parses=KeptPerBody(PARSES_PER_BODY),
        )
        for _ in range(2):
            sent(gateway, CHAT, conversation())
        assert len(gateway.parses) == 1
        for n in range(8):  # other conversations push it out of the reader
            body = agent_conversation(2000)
            body["messages"][0] = {"role": "system", "content": f"Another assistant, number {n}."}
            sent(gateway, CHAT, orjson.dumps({**body, "model": "gpt-4o"}))
        gc.collect()
        assert len(gateway.parses) == 0
