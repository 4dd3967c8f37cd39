"""The work budget: heavy steps spend from it before they work, and stop before overspending."""

from __future__ import annotations

import base64
import threading

import pytest

from proxy.apis.openai.responses import ResponsesAdapter
from proxy.core.costs.images import TileCost
from proxy.core.costs.media import file_cost
from proxy.core.costs.tool_schema import render_namespace
from proxy.core.counting.request_count import RequestCounter
from proxy.core.counting.tokenizer import EncoderTokenizer
from proxy.core.work_budget import OverBudget, budgeted, spend
from tests.support.trimming import profile


class Recording:
    """An encoder that remembers what it was asked to encode: one token per character."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def encode(self, text: str) -> list[int]:
        self.texts.append(text)
        return [0] * len(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]


class TestSpend:
    def test_without_a_budget_any_amount_is_spent(self):
        spend(10**12)

    def test_a_budget_is_spent_down_to_zero(self):
        with budgeted(10):
            spend(4)
            spend(6)
            with pytest.raises(OverBudget):
                spend(1)

    def test_the_budget_ends_with_its_block(self):
        with budgeted(1), pytest.raises(OverBudget):
            spend(2)
        spend(10**12)

    def test_another_thread_does_not_see_the_budget(self):
        """The budget is the calling context's: work moved to a thread runs unbudgeted."""
        seen: list[BaseException | None] = []

        def elsewhere() -> None:
            try:
                spend(10**12)
                seen.append(None)
            except OverBudget as exc:
                seen.append(exc)

        with budgeted(0):
            worker = threading.Thread(target=elsewhere)
            worker.start()
            worker.join()
        assert seen == [None]


class TestEncoderSpends:
    def test_a_text_within_the_budget_is_encoded(self):
        encoder = Recording()
        tokenizer = EncoderTokenizer("chars", encoder.encode)
        with budgeted(5):
            assert tokenizer.count("hello") == 5
        assert encoder.texts == ["hello"]

    def test_a_text_past_the_budget_is_not_encoded(self):
        encoder = Recording()
        tokenizer = EncoderTokenizer("chars", encoder.encode)
        with budgeted(4), pytest.raises(OverBudget):
            tokenizer.count("hello")
        assert encoder.texts == []

    def test_a_batch_spends_all_its_characters_before_encoding_any(self):
        encoder = Recording()
        tokenizer = EncoderTokenizer("chars", encoder.encode, encode_batch=encoder.encode_batch)
        with budgeted(9), pytest.raises(OverBudget):
            tokenizer.count_many(["hello", "world"])
        assert encoder.texts == []


class TestOtherStepsSpend:
    def test_a_file_part_spends_its_bytes_before_decoding_them(self):
        data = "data:application/pdf;base64," + base64.b64encode(b"%PDF-1.4 " + b"x" * 3000).decode()
        part = {"type": "file", "file": {"file_data": data}}
        with budgeted(len(data) - 1), pytest.raises(OverBudget):
            file_cost(part, TileCost(85, 170))
        with budgeted(len(data)):
            assert file_cost(part, TileCost(85, 170))[2][0].startswith("file of")

    def test_rendering_tool_definitions_spends_what_it_builds(self):
        properties = {f"field_{i}": {"type": "string", "description": "d" * 20} for i in range(20)}
        function = {"name": "lookup", "parameters": {"type": "object", "properties": properties}}
        with budgeted(100), pytest.raises(OverBudget):
            render_namespace([function])
        with budgeted(10_000):
            assert "lookup" in render_namespace([function]).text


class TestItems:
    """A conversation's items spend from the budget, not only its characters."""

    def test_a_responses_body_of_many_one_character_items_overspends_before_it_is_read(self):
        body = {"model": "gpt-4o", "input": [{"role": "user", "content": "a"} for _ in range(2_000)]}
        with budgeted(4096), pytest.raises(OverBudget):
            ResponsesAdapter().parse(body)

    def test_a_conversation_of_many_messages_overspends_before_it_is_counted(self):
        encoder = Recording()
        counter = RequestCounter(profile(100_000), EncoderTokenizer("rec", encoder.encode))
        with budgeted(4096), pytest.raises(OverBudget):
            counter.request({"messages": [{"role": "user", "content": "a"} for _ in range(2_000)]})
        assert encoder.texts == []  # stopped before any encoding
