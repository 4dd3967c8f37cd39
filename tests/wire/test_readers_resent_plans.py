"""A body sent again as it was is planned once per client, window and tokenizer: its plan is
the earlier one's, kept as long as the prefix reader keeps the body, and never another client's."""

from __future__ import annotations

import dataclasses
import gc
import weakref
from typing import Any

import orjson
import pytest

from bench.conversations import agent_conversation
from proxy.apis.anthropic.messages import MessagesAdapter
from proxy.apis.fitting import Counting, fit
from proxy.apis.registry import AdapterRegistry
from proxy.config.settings import Settings
from proxy.core.plan import TrimPolicy
from proxy.server.backends import models as models_module
from proxy.server.backends.models import Models
from proxy.wire.readers import BodyReaders, ResentPlans
from tests.support.trimming import profile, tokenizer

ENDPOINT = AdapterRegistry().endpoint_for("/v1/chat/completions")
assert ENDPOINT is not None


@pytest.fixture
def models(model_map: dict[str, Any]) -> Models:
    return Models(Settings(), model_map)


@pytest.fixture
def plans_made(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many plans were made from scratch (the core's count and trim)."""
    made: list[int] = []
    real = models_module.fit

    def counted(*args: Any, **kwargs: Any) -> Any:
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(models_module, "fit", counted)
    return made


class Client:
    """Reads bodies as the handler does (one reader kept across requests) and plans them."""

    def __init__(self, models: Models, readers: BodyReaders, scope: object) -> None:
        self.models, self.readers, self.scope = models, readers, scope

    def plan(self, raw: bytes, window: int | None = None) -> Any:
        reading = self.readers.read(ENDPOINT.adapter, raw)
        parsed = ENDPOINT.parse(reading.value, reading.known)
        self.readers.accepted(ENDPOINT.adapter, reading)
        return self.models.fit(ENDPOINT.adapter, parsed, window, client=self.scope)


def conversation(tokens: int = 3000, question: str | None = None) -> bytes:
    body = agent_conversation(tokens)
    body["model"] = "gpt-4o"
    if question is not None:
        body["messages"].append({"role": "user", "content": question})
    return orjson.dumps(body)


@pytest.fixture
def readers() -> BodyReaders:
    return BodyReaders(AdapterRegistry().adapters, prefix_memory_bytes=8 * 1024 * 1024)


class TestResentPlans:
    def test_a_body_sent_again_is_planned_from_the_plan_of_the_bytes_before(self, models, readers, plans_made):
        client = Client(models, readers, ("key", b"a"))
        raw = conversation()
        first, second, third = (client.plan(raw) for _ in range(3))
        assert len(plans_made) == 2  # the first sending and the first sending again; the third reuses
        assert third.plan.count == second.plan.count == first.plan.count
        assert third.plan.result.outcome == first.plan.result.outcome
        assert not third.changed and third.body is third.parsed.body  # forwarded as received
        assert third.plan == dataclasses.replace(
            second.plan, body=third.parsed.body, count_seconds=third.plan.count_seconds, trim_seconds=0.0
        )  # the kept plan in every other field

    def test_another_client_sending_the_same_bytes_is_planned_anew(self, models, readers, plans_made):
        raw = conversation()
        for _ in range(3):
            Client(models, readers, ("key", b"a")).plan(raw)
        Client(models, readers, ("key", b"b")).plan(raw)
        assert len(plans_made) == 3

    def test_another_window_is_planned_anew(self, models, readers, plans_made):
        client = Client(models, readers, ("key", b"a"))
        raw = conversation()
        for _ in range(3):
            client.plan(raw)
        corrected = client.plan(raw, window=4000)
        assert len(plans_made) == 3
        assert corrected.plan.result.budget.context_window == 4000

    def test_a_body_that_differs_is_planned_anew(self, models, readers, plans_made):
        client = Client(models, readers, ("key", b"a"))
        for _ in range(3):
            client.plan(conversation(question="And the totals?"))
        client.plan(conversation(question="And the totals, again?"))
        assert len(plans_made) == 3

    def test_a_cut_is_made_again_every_time(self, models, readers, plans_made):
        """A cut plan carries the counter that counts a summary put in later: one request's own."""
        client = Client(models, readers, ("key", b"a"))
        raw = conversation(9000)
        fitted = [client.plan(raw, window=6000) for _ in range(3)]
        assert all(f.changed for f in fitted)
        assert len(plans_made) == 3
        assert fitted[2].body == fitted[0].body

    def test_the_plans_go_with_the_bodies_the_reader_lets_go(self, models, plans_made):
        readers = BodyReaders(AdapterRegistry().adapters, prefix_memory_bytes=8 * 1024 * 1024)
        client = Client(models, readers, ("key", b"a"))
        raw = conversation()
        for _ in range(3):
            client.plan(raw)
        assert len(models.resent) == 1
        del client, readers
        gc.collect()
        assert len(models.resent) == 0


class TestResentEditedBodies:
    def test_a_body_the_guard_edits_goes_edited_again_with_its_count_before_the_edits(self) -> None:
        """For an upstream that cannot edit, the kept plan's edited body is what is sent again."""
        adapter = MessagesAdapter()
        body = {
            "model": "claude-sonnet-4-5",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "Hello"}],
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        }
        parsed = adapter.parse(body)
        counting = Counting(profile(16_000, "claude-sonnet-4-5"), tokenizer("claude-sonnet-4-5"), edits_by_guard=True)
        made = fit(adapter, parsed, counting, TrimPolicy())
        earlier = _Body()
        again = dataclasses.replace(parsed, same_as=weakref.ref(earlier))
        plans = ResentPlans(lambda: 0.0)
        plans.fitted(again, lambda: "key", lambda: made)

        def planned_again() -> Any:
            raise AssertionError("the kept plan is used")

        reused = plans.fitted(again, lambda: "key", planned_again)
        assert reused.body == made.body and "context_management" not in reused.body
        assert reused.plan.rewritten and reused.original_tokens == made.original_tokens is not None


class _Body:
    """An earlier body, as the prefix reader keeps it (weakly referenced)."""
