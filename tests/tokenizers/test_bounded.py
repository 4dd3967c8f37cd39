"""`bound:<name>` tokenizers count through the exact tokenizers' path: the work budget,
slices, one token per byte where no cut is found, the fallback on a native panic, cancellation."""

from __future__ import annotations

import random
import string
import threading

import pytest

from proxy.core.work_budget import OverBudget, WorkCancelled, bound, budgeted
from proxy.tokenizers.bounded import BOUND_BASE, bound_tokenizer
from proxy.tokenizers.vocabularies import Tokenizers


@pytest.fixture(scope="module")
def encoding():
    return Tokenizers()._tiktoken_encoding(BOUND_BASE)


class TestBoundTokenizer:
    def test_a_count_spends_its_characters_from_the_budget_before_encoding(self, encoding):
        tokenizer = bound_tokenizer("claude", 1.0, encoding, lambda texts: [encoding.encode_ordinary(t) for t in texts])
        with budgeted(100), pytest.raises(OverBudget):
            tokenizer.count("word " * 1000)
        with budgeted(100), pytest.raises(OverBudget):
            tokenizer.count_many(["word " * 30, "word " * 30])

    def test_a_stretch_with_no_cut_is_counted_at_one_token_per_byte_scaled(self, encoding):
        tokenizer = bound_tokenizer("claude", 1.0, encoding, lambda texts: [encoding.encode_ordinary(t) for t in texts])
        letters = "".join(random.Random(1).choices(string.ascii_lowercase, k=200_000))
        assert tokenizer.count(letters) == int(1.3 * 200_000)  # bytes x Claude's multiplier, no class term

    def test_a_panic_of_the_encoder_is_counted_by_its_bytes(self):
        class Panicking:
            def encode_ordinary(self, text: str) -> list[int]:
                raise BaseException("native panic")  # as tiktoken's Rust core on a million spaces

        tokenizer = bound_tokenizer("open", 1.0, Panicking(), lambda texts: [[]])  # type: ignore[arg-type]
        assert tokenizer.count("abc") == 4  # ceil(1.2 x 3 bytes)

    def test_a_long_count_stops_at_a_checkpoint_once_its_request_is_cancelled(self, encoding):
        tokenizer = bound_tokenizer("open", 1.0, encoding, lambda texts: [encoding.encode_ordinary(t) for t in texts])
        gone = threading.Event()
        gone.set()
        with bound(gone), pytest.raises(WorkCancelled):
            tokenizer.count("word " * 10_000)
