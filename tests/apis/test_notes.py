"""The budget note in every API shape the guard trims: where the dropped history was, in the
shape's own form (Responses: a system message item; Anthropic Messages: a text block opening the
user message after the cut); legacy completions have no history, so no note."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.apis.anthropic.messages import MessagesAdapter
from proxy.apis.base import Adapter
from proxy.apis.fitting import Fitted
from proxy.apis.openai.completions import CompletionsAdapter
from proxy.apis.openai.responses import ResponsesAdapter
from proxy.config.settings import settings_from_dict
from proxy.server.backends.models import Models
from proxy.tokenizers.model_map import load_model_map
from tests.apis.fitting import words
from tests.support.validity import messages_problems, responses_problems

NOTE_END = "to fit the context window."


@pytest.fixture(scope="module")
def guard() -> Models:
    settings = settings_from_dict({"trim": {"budget_note": True}}, "notes.yaml", {})
    return Models(settings, load_model_map())


def fitted(guard: Models, adapter: Adapter, body: dict[str, Any], window: int = 3000) -> Fitted:
    return guard.fit(adapter, adapter.parse(body), window, guard.counted_as("gpt-4o"))


def turns(n: int) -> list[dict[str, Any]]:
    return [
        message
        for i in range(n)
        for message in (
            {"role": "user", "content": f"question {i} " + words(60)},
            {"role": "assistant", "content": f"answer {i} " + words(100)},
        )
    ]


class TestResponses:
    def body(self) -> dict[str, Any]:
        items = [{"type": "message", **m} for m in turns(30)]
        return {"model": "gpt-4o", "instructions": "Be brief.", "input": [*items, {"role": "user", "content": "now?"}]}

    def test_the_note_is_a_system_message_item_where_the_dropped_items_were(self, guard):
        result = fitted(guard, ResponsesAdapter(), self.body())
        items = result.body["input"]
        notes = [k for k, item in enumerate(items) if item.get("role") == "system"]
        assert len(notes) == 1 and items[notes[0]]["content"].endswith(NOTE_END)
        (k,) = notes
        original = self.body()["input"]
        assert items[: k - 1] == original[: k - 1]  # the opening, as sent (its last item may be shortened)
        assert items[k + 1]["content"].startswith("question ") and items[k + 1] != original[k]  # after the cut
        assert items[-1] == original[-1] and responses_problems(result.body) == []

    def test_the_rendered_body_parses_and_counts_as_the_trim_planned(self, guard):
        result = fitted(guard, ResponsesAdapter(), self.body())
        again = fitted(guard, ResponsesAdapter(), dict(result.body))
        assert again.plan.result.outcome == "unchanged"
        assert abs(again.plan.count.total - result.plan.result.tokens_after) <= 8


class TestAnthropicMessages:
    def body(self) -> dict[str, Any]:
        return {
            "model": "claude-sonnet-4-5",
            "max_tokens": 400,
            "system": "Be brief.",
            "messages": [*turns(30), {"role": "user", "content": "now?"}],
        }

    def test_the_note_opens_the_user_message_after_the_cut_as_a_text_block(self, guard):
        result = fitted(guard, MessagesAdapter(), self.body())
        messages = result.body["messages"]
        with_note = [m for m in messages if isinstance(m["content"], list)]
        assert len(with_note) == 1
        blocks = with_note[0]["content"]
        assert blocks[0]["type"] == "text" and blocks[0]["text"].endswith(NOTE_END)
        assert blocks[1]["text"].startswith("question ")
        assert messages_problems(result.body) == []  # roles still alternate, opening on a user message
        assert result.body["system"] == "Be brief." and messages[-1] == self.body()["messages"][-1]

    def test_the_opening_before_the_note_is_as_sent(self, guard):
        result = fitted(guard, MessagesAdapter(), self.body())
        messages = result.body["messages"]
        k = next(i for i, m in enumerate(messages) if isinstance(m["content"], list))
        assert k > 0 and messages[: k - 1] == self.body()["messages"][: k - 1]


class TestCompletions:
    def test_a_cut_prompt_carries_its_marker_and_no_note(self, guard):
        body = {"model": "gpt-4o", "prompt": "Once upon a time " + words(4000), "max_tokens": 100}
        result = fitted(guard, CompletionsAdapter(), body)
        prompt = result.body["prompt"]
        assert result.plan.result.outcome == "trimmed" and "tokens removed ...]" in prompt
        assert NOTE_END not in prompt and prompt.startswith("Once upon a time")
