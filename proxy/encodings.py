"""Loads tokenizers from local files only: tiktoken encodings, Hugging Face `tokenizer.json` files,
and the vocabulary inside a GGUF model file (`proxy.gguf_vocab`).

tiktoken fetches an encoding from the network unless its file is already in the directory named
by `TIKTOKEN_CACHE_DIR`, under the SHA-1 of its download URL. litellm ships the `cl100k_base`
and `o200k_base` files in exactly that layout, so we point tiktoken at litellm's folder (found on
disk, without importing litellm) or at a folder the operator names, and we check that the file is
there *before* asking tiktoken: a missing encoding is a startup error, never a download.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from proxy.bundled import litellm_file
from proxy.core.models import TokenizerSpec
from proxy.core.tokenizer import CharEstimateTokenizer, EncoderTokenizer, Tokenizer
from proxy.errors import ConfigError
from proxy.gguf_vocab import gguf_encoder

if TYPE_CHECKING:
    import tiktoken

_ENCODING_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"


def bundled_encodings_dir() -> Path | None:
    """litellm's folder of tiktoken files, located without importing litellm."""
    return litellm_file("litellm_core_utils", "tokenizers")


def encoding_file_name(name: str) -> str:
    return hashlib.sha1(_ENCODING_URL.format(name=name).encode()).hexdigest()


class Tokenizers:
    """Builds and keeps one tokenizer per spec. Thread-safe; loads each file once."""

    def __init__(self, encodings_dirs: Iterable[Path] = ()) -> None:
        dirs = [Path(d) for d in encodings_dirs]
        if os.environ.get("TIKTOKEN_CACHE_DIR"):
            dirs.append(Path(os.environ["TIKTOKEN_CACHE_DIR"]))
        bundled = bundled_encodings_dir()
        if bundled is not None:
            dirs.append(bundled)
        self.encodings_dirs = tuple(dirs)
        self._loaded: dict[TokenizerSpec, Tokenizer] = {}
        self._lock = threading.Lock()

    def get(self, spec: TokenizerSpec) -> Tokenizer:
        tokenizer = self._loaded.get(spec)
        if tokenizer is None:
            with self._lock:
                tokenizer = self._loaded.get(spec)
                if tokenizer is None:
                    tokenizer = self._load(spec)
                    self._loaded[spec] = tokenizer
        return tokenizer

    def available_encodings(self) -> list[str]:
        """The tiktoken encodings whose files are on disk in the folders searched."""
        names = ("o200k_base", "cl100k_base", "p50k_base", "p50k_edit", "r50k_base", "gpt2")
        return [n for n in names if any((d / encoding_file_name(n)).is_file() for d in self.encodings_dirs)]

    def preload(self, specs: Iterable[TokenizerSpec]) -> None:
        for spec in specs:
            self.get(spec)

    def _load(self, spec: TokenizerSpec) -> Tokenizer:
        if spec.kind == "estimate":
            ratio, _, mode = spec.source.partition(":")
            return CharEstimateTokenizer(float(ratio), "byte" if mode == "bytes" else "char")
        if spec.kind == "huggingface":
            return EncoderTokenizer(
                f"hf:{Path(spec.source).name}",
                _hf_encoder(spec.source),
                spec.multiplier,
                source_id=tokenizer_file_id(spec.source),
            )
        encoding = self._tiktoken_encoding(spec.source)
        return EncoderTokenizer(
            spec.source, encoding.encode_ordinary, spec.multiplier, _chunked(encoding.encode_ordinary)
        )

    def _tiktoken_encoding(self, name: str) -> tiktoken.Encoding:
        import tiktoken

        file_name = encoding_file_name(name)
        folder = next((d for d in self.encodings_dirs if (d / file_name).is_file()), None)
        if folder is None:
            searched = ", ".join(str(d) for d in self.encodings_dirs) or "no folder"
            raise ConfigError(
                f"tiktoken encoding {name!r} is not on disk (looked for {file_name} in {searched}); "
                "install litellm, or set tokenizers.encodings_dir to a folder holding it"
            )
        # tiktoken reads the folder from the environment on every load; it is set once, here.
        os.environ["TIKTOKEN_CACHE_DIR"] = str(folder)
        try:
            return tiktoken.get_encoding(name)
        except Exception as exc:  # a corrupt file, an unknown name: fail at start, with the reason
            raise ConfigError(f"tiktoken encoding {name!r} failed to load from {folder}: {exc}") from exc


# tiktoken releases the GIL while it encodes: a request's many texts, split into one contiguous
# chunk per core, count in about half the time on two cores. One pool serves every request.
_WORKERS = max(1, min(4, os.cpu_count() or 1))
_POOL = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="context-guard-encode")
_PARALLEL_MIN_CHARS = 256 * 1024  # below this, threads cost more than they save


def _chunked(encode: Callable[[str], list[int]]) -> Callable[[list[str]], list[list[int]]]:
    def encode_all(texts: list[str]) -> list[list[int]]:
        if _WORKERS == 1 or sum(map(len, texts)) < _PARALLEL_MIN_CHARS:
            return [encode(t) for t in texts]
        size = -(-len(texts) // _WORKERS)
        chunks = [texts[i : i + size] for i in range(0, len(texts), size)]
        return [ids for chunk in _POOL.map(lambda c: [encode(t) for t in c], chunks) for ids in chunk]

    return encode_all


def tokenizer_file_id(path: str) -> str:
    """A tokenizer file's full identity: its resolved path and the SHA-256 of its content."""
    file = Path(path)
    try:
        digest = hashlib.sha256(file.read_bytes()).hexdigest()
    except OSError as exc:
        raise ConfigError(f"Hugging Face tokenizer file {path!r} cannot be read: {exc.strerror or exc}") from None
    return f"{file.resolve()}:{digest}"


def _hf_encoder(path: str):  # type: ignore[no-untyped-def]  # returns a closure over the tokenizer
    """`huggingface:<path>`: a `tokenizer.json` file, or the vocabulary inside a `.gguf` model file."""
    from tokenizers import Tokenizer as HfTokenizer

    if not Path(path).is_file():
        raise ConfigError(f"Hugging Face tokenizer file {path!r} does not exist")
    if path.lower().endswith(".gguf"):
        try:
            return gguf_encoder(path)
        except (OSError, ValueError, KeyError, struct.error) as exc:
            raise ConfigError(f"the vocabulary of GGUF file {path!r} failed to load: {exc}") from exc
    try:
        tokenizer = HfTokenizer.from_file(path)
    except Exception as exc:
        raise ConfigError(f"Hugging Face tokenizer {path!r} failed to load: {exc}") from exc

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    return encode
