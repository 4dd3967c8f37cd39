"""Gemma's SentencePiece vocabularies, with which Google's own SDKs count Gemini, read offline.

google-genai's local tokenizer (`google/genai/_local_tokenizer_loader.py`) counts gemini-2.0,
gemini-2.5 and gemini-3 (`-pro-preview`, `-flash-preview`) with Gemma 3's SentencePiece model and
gemini-3.1 and gemini-3.5 with Gemma 4's; the Vertex and Go SDKs before it counted gemini-1.0 and
1.5 with the first Gemma's (Gemma 1 and 2 share it). The SDKs download those files at run time;
the guard never does. All three ship in one package on the index, `maxtext` (Google's MaxText,
Apache-2.0), under `maxtext/assets/tokenizers/`, found on disk without importing it
(`proxy.tokenizers.family_vocabularies` reads them as `vocab:gemma`, `vocab:gemma3`, `vocab:gemma4`).

Each file is checked against its SHA-256 when it loads: a maxtext release that changed one is
treated as a missing vocabulary (the family is counted with its bound), never read unchecked.

- `gemma`: byte-identical to the file the Go and Vertex SDKs pin for gemini-1.x (gemma_pytorch's
  `tokenizer/tokenizer.model`, 256,000 pieces).
- `gemma3`: the 262,144 pieces, scores, types and normaliser of the file google-genai pins
  (gemma_pytorch's `gemma3_cleaned_262144_v2.spiece.model`, SHA-256 `1299c11d...`, 2 bytes longer),
  except one reserved piece: id 256000 is `<unused99>` here where that file has `<end_of_image>`.
  Text that spells `<end_of_image>` counts a few tokens more here (never fewer); text that spells
  `<unused99>` counts 1 where that file counts 5 (docs/counting.md).
- `gemma4`: Google's `tokenizer_gemma4.model`. google-genai reads Gemma 4 from Hugging Face
  (`google/gemma-4-E4B-it`) with transformers instead; this file encodes llama.cpp's 46 Gemma 4
  test vectors, generated from that tokenizer, exactly (tests/tokenizers/test_gemma.py).
"""

from __future__ import annotations

from dataclasses import dataclass

GEMMA_PACKAGE = "maxtext"  # the import name and the name on the package index
# maxtext's wheel asks for Python 3.12; the guard only reads its data files, so on any Python:
GEMMA_INSTALL = "pip install --no-deps --ignore-requires-python 'maxtext>=0.2.5,<0.3'"
GEMMA_LICENSE = "Apache-2.0 (maxtext); the vocabularies are Gemma's"


@dataclass(frozen=True, slots=True)
class GemmaFile:
    """One Gemma vocabulary in the maxtext package: its path there and its SHA-256."""

    path: str
    sha256: str


GEMMA_FILES: dict[str, GemmaFile] = {
    "gemma": GemmaFile(
        "assets/tokenizers/tokenizer.gemma", "61a7b147390c64585d6c3543dd6fc636906c9af3865a5548f27f31aee1d4c8e2"
    ),
    "gemma3": GemmaFile(
        "assets/tokenizers/tokenizer.gemma3", "a96dfa1c296977bd225176202b305aeb29f3f49cc7d54b15bd31e998f91b9736"
    ),
    "gemma4": GemmaFile(
        "assets/tokenizers/tokenizer_gemma4.model", "9f318ac4dc02f8580e3f65ff0b37286e7c3d1e5d664737bb2c8ca812b5453162"
    ),
}
