"""llama.cpp's vocabulary GGUFs load and encode its shipped test vectors exactly.

The files come from llama-cpp-python's source distribution (which vendors llama.cpp), installed by
scripts/install-vocabs.sh into the user's cache; `make test` and CI run it first. Each `.inp` file
holds texts separated by `__ggml_vocab_test__` lines, each `.out` line the ids llama.cpp (and the
model's Hugging Face tokenizer) gives that text with no special tokens added.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest

from proxy.tokenizers.gguf import gguf_encoder, read_metadata, shipped_vocab, vocabs_dir

SEPARATOR = "\n__ggml_vocab_test__\n"
# Every vocabulary llama.cpp ships with test vectors, but BERT's WordPiece (an embedding model's).
WITH_VECTORS = (
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
)


def _vocab(name: str) -> Path:
    path = shipped_vocab(name)
    if path is None:
        message = f"{vocabs_dir()} has no ggml-vocab-{name}.gguf: run scripts/install-vocabs.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(message)  # on CI nothing may be skipped
        pytest.skip(message)
    return path


@cache
def _encoder(name: str) -> Callable[[str], list[int]]:
    return gguf_encoder(str(_vocab(name)))


def _vectors(name: str) -> list[tuple[str, list[int]]]:
    path = _vocab(name)
    texts = Path(f"{path}.inp").read_text(encoding="utf-8").split(SEPARATOR)
    ids = Path(f"{path}.out").read_text(encoding="utf-8").split("\n")
    assert len(ids) >= len(texts) > 30
    return [(text, [int(i) for i in line.split()]) for text, line in zip(texts, ids, strict=False)]


class TestShippedVocabularies:
    @pytest.mark.parametrize("name", WITH_VECTORS)
    def test_every_test_vector_encodes_as_llama_cpp_encodes_it(self, name: str) -> None:
        encode = _encoder(name)
        wrong = [(text, expected, encode(text)) for text, expected in _vectors(name) if encode(text) != expected]
        assert not wrong, f"{len(wrong)} of the {name} vectors differ, the first: {wrong[0]!r}"

    def test_llama_3_takes_a_whole_word_that_is_a_token_without_merging(self) -> None:
        """`ignore_merges`: merging 'Cửa Việt' byte pair by byte pair gives 5 tokens, not the 3 of llama.cpp."""
        assert _encoder("llama-bpe")("Cửa Việt") == [34, 91163, 101798]

    def test_sentencepiece_falls_back_to_bytes_for_a_character_it_lacks(self) -> None:
        encode = _encoder("llama-spm")
        ids = encode("🦙")  # not in Llama 2's 32,000 pieces: its four UTF-8 bytes, after the space piece
        assert len(ids) == 5 and all(3 <= i < 3 + 256 for i in ids[1:])

    def test_the_kinds_read_are_the_ones_claimed(self) -> None:
        kinds = {name: read_metadata(_vocab(name)).get("tokenizer.ggml.model") for name in ("llama-spm", "gemma-4")}
        assert kinds == {"llama-spm": "llama", "gemma-4": "gemma4"}
