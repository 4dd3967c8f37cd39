"""Gemini and Gemma are counted with the Gemma vocabularies Google's own SDKs count them with
(proxy.tokenizers.gemma), read from the files maxtext ships, checked by hash, never downloaded.

The references are independent of the guard's loader: google-genai's own `LocalTokenizer` (its
loader handed the local file instead of a download), Google's published `countTokens` examples,
llama.cpp's Gemma 4 test vectors and the Gemma 4 counts pinned from llama.cpp's GGUF
(tests/data/families/gguf_counts.json)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import random
from pathlib import Path

import pytest

from proxy.apis.gemini.generate_content import GenerateContentAdapter
from proxy.core.counting.request_count import RequestCounter
from proxy.core.models.families import GEMINI_FRAMING_RATIO
from proxy.core.models.model_registry import TokenizerSpec, family_for
from proxy.tokenizers.family_vocabularies import VocabularyMissing, load_vocabulary, vocabulary_file
from proxy.tokenizers.gemma import GEMMA_FILES
from proxy.tokenizers.gguf import shipped_vocab
from proxy.tokenizers.vocabularies import Tokenizers
from tests.support.trimming import profile, tokenizer

DATA = Path(__file__).parent.parent / "data/families"
CORPUS: dict[str, str] = json.loads((DATA / "corpus.json").read_text("utf-8"))
GGUF_COUNTS = json.loads((DATA / "gguf_counts.json").read_text("utf-8"))
# Texts of kinds the corpus does not hold on its own: short prompts, scripts side by side,
# whitespace alone, a spelled special token, a long mixed document (counted in slices).
EXTRA = {
    "empty_line": "\n",
    "spaces": "    ",
    "tabs_and_newlines": "\t\t\n\n\n\t ",
    "mixed_scripts": "Grüße, мир! 你好\uff0c世界。こんにちは 안녕하세요 สวัสดี مرحبا नमस्ते 🦙🫩",
    "digits": "3.14159265358979323846 1,234,567 0x7fffffff 2026-11-28T04:44:24Z",
    "spelled_turn": "<start_of_turn>user\nhi<end_of_turn>",
    "long_document": "\n\n".join(CORPUS.values()) * 4,
}
TEXTS = {**CORPUS, **EXTRA}


@functools.cache
def gemini_counter(tokenizer_name: str):
    """google-genai's LocalTokenizer for a model it maps to `tokenizer_name`."""
    genai = pytest.importorskip("google.genai.local_tokenizer")
    model = {"gemma3": "gemini-2.5-pro"}[tokenizer_name]
    return genai.LocalTokenizer(model_name=model)


@pytest.fixture
def offline_sdk(monkeypatch, tmp_path):
    """google-genai's tokenizer loader, handed maxtext's Gemma 3 file in place of its download
    (its URL and hash swapped for the local file's; its cache folder a temporary one)."""
    loader = pytest.importorskip("google.genai._local_tokenizer_loader")
    path = vocabulary_file("gemma3")

    def read_local(url: str) -> bytes:
        assert url == path.as_uri(), "the SDK asked for a file other than the local one"
        return path.read_bytes()

    config = loader._TokenizerConfig(model_url=path.as_uri(), model_hash=GEMMA_FILES["gemma3"].sha256)
    monkeypatch.setitem(loader._TOKENIZERS, "gemma3", config)
    monkeypatch.setattr(loader, "_load_file", read_local)
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    loader.load_model_proto.cache_clear()
    loader.get_sentencepiece.cache_clear()
    gemini_counter.cache_clear()
    yield loader
    loader.load_model_proto.cache_clear()
    loader.get_sentencepiece.cache_clear()
    gemini_counter.cache_clear()


def count(model: str, text: str) -> int:
    return Tokenizers().get(family_for(model).tokenizer).count(text)


class TestTheShippedFiles:
    @pytest.mark.parametrize("name", sorted(GEMMA_FILES))
    def test_each_file_is_the_one_whose_hash_is_pinned(self, name):
        assert hashlib.sha256(vocabulary_file(name).read_bytes()).hexdigest() == GEMMA_FILES[name].sha256

    def test_gemma3_has_the_vocabulary_google_genai_pins(self):
        """The piece types, normaliser and options of gemma_pytorch's gemma3_cleaned_262144_v2 (the
        file google-genai downloads), as published: 255,474 normal pieces, 6,410 user-defined,
        256 bytes, 3 control, 1 unknown; no dummy prefix, whitespace kept, digits split."""
        model_pb2 = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
        model = model_pb2.ModelProto()
        model.ParseFromString(vocabulary_file("gemma3").read_bytes())
        kinds: dict[int, int] = {}
        for piece in model.pieces:
            kinds[piece.type] = kinds.get(piece.type, 0) + 1
        types = model_pb2.ModelProto.SentencePiece
        assert kinds == {
            types.NORMAL: 255474,
            types.USER_DEFINED: 6410,
            types.BYTE: 256,
            types.CONTROL: 3,
            types.UNKNOWN: 1,
        }
        assert (model.normalizer_spec.name, model.normalizer_spec.add_dummy_prefix) == ("identity", False)
        assert not model.normalizer_spec.remove_extra_whitespaces
        assert model.trainer_spec.split_digits and model.trainer_spec.byte_fallback
        scores = {piece.piece: piece.score for piece in model.pieces}
        assert {k: scores[k] for k in ("He", "el", "ll", "lo")} == {
            "He": -1715.0,
            "el": -41.0,
            "ll": -365.0,
            "lo": -350.0,
        }

    def test_a_file_whose_hash_differs_is_a_missing_vocabulary(self, tmp_path, monkeypatch):
        from proxy.tokenizers import family_vocabularies as families

        other = tmp_path / "tokenizer.gemma3"
        data = vocabulary_file("gemma3").read_bytes()
        other.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
        monkeypatch.setattr(families, "vocabulary_file", lambda name: other)
        monkeypatch.setattr(families, "_LOADED", {})
        with pytest.raises(VocabularyMissing, match="SHA-256"):
            families.load_vocabulary("gemma3")

    def test_nothing_is_downloaded(self, monkeypatch):
        """The vocabularies load with every socket refused."""
        import socket

        def refuse(*args, **kwargs):
            raise AssertionError("a Gemma vocabulary tried the network")

        monkeypatch.setattr(socket.socket, "connect", refuse)
        from proxy.tokenizers import family_vocabularies as families

        monkeypatch.setattr(families, "_LOADED", {})
        assert len(families.load_vocabulary("gemma4")("Hello world")) == 2


@pytest.mark.filterwarnings("ignore:The SDK's local tokenizer implementation is experimental")
class TestGeminiCountsWhatGoogleGenaiCounts:
    @pytest.mark.parametrize("kind", sorted(TEXTS))
    def test_every_text_counts_what_the_sdks_local_tokenizer_counts(self, offline_sdk, kind):
        sdk = gemini_counter("gemma3").count_tokens(TEXTS[kind]).total_tokens
        assert count("gemini-2.5-pro", TEXTS[kind]) >= sdk
        if kind not in ("long_document",):  # slices of a long text may count a little high, never low
            assert count("gemini-2.5-pro", TEXTS[kind]) == sdk

    def test_googles_published_count_tokens_examples(self):
        """ai.google.dev's countTokens reference: "The quick brown fox jumps over the lazy dog." is
        10 tokens (gemini-2.0-flash); google-genai's docstring: "What is your name?" is 5."""
        for model in ("gemini-2.0-flash", "gemini-2.5-pro", "gemini-3.1-pro-preview", "gemini-1.5-flash"):
            assert count(model, "The quick brown fox jumps over the lazy dog.") == 10
            assert count(model, "What is your name?") == 5

    def test_the_count_names_the_vocabulary_and_says_it_is_an_estimate(self, counter_for):
        request = {"model": "gemini-2.5-pro", "messages": [{"role": "user", "content": "Hi"}]}
        count = counter_for("vertex_ai/gemini-2.5-pro").request(request)
        assert count.tokenizer == "gemma3" and not count.exact
        assert "counted with gemma3, an estimate for this model that errs high" in count.notes

    def test_a_one_turn_request_is_never_under_the_billed_prompt(self, counter_for):
        """The same reference bills that prompt, sent to generateContent, as 11 prompt tokens:
        the turn's framing (one token there) is counted with room to spare."""
        request = {
            "model": "gemini-2.0-flash",
            "messages": [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}],
        }
        assert counter_for("gemini-2.0-flash").request(request).total >= 11


class TestGemma4:
    def test_encodes_llama_cpps_gemma_4_test_vectors_exactly(self):
        path = shipped_vocab("gemma-4")
        if path is None:
            message = "llama.cpp's vocabularies are not installed: run scripts/install-vocabs.sh"
            if os.environ.get("CI") == "true":
                pytest.fail(message)
            pytest.skip(message)
        texts = Path(f"{path}.inp").read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
        ids = Path(f"{path}.out").read_text(encoding="utf-8").split("\n")
        encode = load_vocabulary("gemma4")
        wrong = [text for text, line in zip(texts, ids, strict=False) if encode(text) != [int(i) for i in line.split()]]
        assert len(texts) == 46 and not wrong

    def test_counts_the_corpus_as_llama_cpps_gguf_counted_it(self):
        pinned = GGUF_COUNTS["gemma-4"]
        assert {k: count("gemini-3.1-pro-preview", CORPUS[k]) for k in pinned} == pinned


class TestWhichModelsAreCountedWithWhichVocabulary:
    def test_every_model_google_genai_maps_gets_the_same_vocabulary(self):
        loader = pytest.importorskip("google.genai._local_tokenizer_loader")
        tables = (
            loader._GEMINI_MODELS_TO_TOKENIZER_NAMES,
            loader._GEMINI_STABLE_MODELS_TO_TOKENIZER_NAMES,
            loader._GEMINI_MODELS_TO_HUGGINGFACE_TOKENIZER_NAMES,
        )
        theirs = {model: name for table in tables for model, name in table.items()}
        assert len(theirs) >= 19
        assert {model: family_for(model).tokenizer.source for model in theirs} == theirs

    @pytest.mark.parametrize(
        ("model", "vocabulary", "exact"),
        [
            ("vertex_ai/gemini-2.5-flash", "gemma3", False),
            ("publishers/google/models/gemini-2.5-pro", "gemma3", False),
            ("gemini-1.5-pro-002", "gemma", False),
            ("google/gemma-3-27b-it", "gemma3", True),
            ("gemma3:12b", "gemma3", True),
            ("google/gemma-4-E4B-it", "gemma4", True),
            ("google/gemma-2-9b-it", "gemma", True),
        ],
    )
    def test_names_as_providers_and_servers_write_them(self, registry, model, vocabulary, exact):
        profile = registry.profile(model)
        assert (profile.tokenizer, profile.tokenizer_exact) == (TokenizerSpec("vocab", vocabulary), exact)

    @pytest.mark.parametrize("model", ["gemini-exp-1206", "gemini-9-ultra", "google/gemma-3n-E4B-it"])
    def test_a_version_no_sdk_maps_keeps_the_bound(self, registry, model):
        assert registry.profile(model).tokenizer == TokenizerSpec("bound", "open")


@pytest.mark.filterwarnings("ignore:The SDK's local tokenizer implementation is experimental")
class TestGeminiFramingRatio:
    """`GEMINI_FRAMING_RATIO`, the ratio Gemini's families state, holds against google-genai's own
    count of the same contents (text alone: what countTokens counts for text parts) on
    conversations of corpus text whose turns are 50 characters or longer."""

    @pytest.mark.parametrize("chars", [50, 100, 500, 2000])
    def test_the_guard_s_count_over_google_genai_s_stays_within_the_stated_ratio(self, offline_sdk, chars):
        counter = RequestCounter(profile(10_000_000, "gemini-2.5-pro"), tokenizer("gemini-2.5-pro"))
        rng = random.Random(chars)
        texts = [t for t in CORPUS.values() if len(t) >= chars]
        for _ in range(15):
            contents = []
            for i in range(rng.randint(1, 30)):
                text = rng.choice(texts)
                start = rng.randrange(len(text) - chars + 1)
                contents.append({"role": ("user", "model")[i % 2], "parts": [{"text": text[start : start + chars]}]})
            ours = counter.request(GenerateContentAdapter().parse({"contents": contents}).chat).total
            theirs = gemini_counter("gemma3").count_tokens(contents).total_tokens
            assert theirs <= ours <= theirs * GEMINI_FRAMING_RATIO
