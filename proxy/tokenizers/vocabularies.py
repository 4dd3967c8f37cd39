"""Loads tokenizers from local files only: tiktoken encodings, Hugging Face `tokenizer.json` files,
and the vocabulary inside a GGUF model file (`proxy.tokenizers.gguf`).

tiktoken fetches an encoding from the network unless its file is already in the directory named
by `TIKTOKEN_CACHE_DIR`, under the SHA-1 of its download URL, and replaces a file whose hash is
wrong by downloading it again. litellm ships the `cl100k_base` and `o200k_base` files in exactly
that layout. We look for the file in a folder the operator names, `TIKTOKEN_CACHE_DIR`, then
litellm's folder (found on disk, without importing litellm), and run tiktoken's constructor for
the encoding with our own reader of that file: a missing encoding is an error, a corrupt one too,
never a download.

A model family's vocabulary (`vocab:`) whose package is not installed is never an error: the
family is counted with `FALLBACK_BOUND` instead, an upper bound, and `vocabulary_missing(spec)`
names the package, for the log line's note and the warning at start.

Vocabularies are loaded when first needed and kept once per process. tiktoken's `Encoding` keeps
the Python dict of ranks it was built from beside the Rust copy it encodes with, and uses that
dict only to be pickled; we build the `Encoding` from tiktoken's own constructor for the name and
then empty the dict we handed it, which frees about 27 MB for o200k_base (13 MB for cl100k_base).
Such an encoding cannot be pickled, and nothing here pickles one.
"""

from __future__ import annotations

import binascii
import contextlib
import hashlib
import os
import struct
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

from proxy.core.counting.tokenizer import CharEstimateTokenizer, EncoderTokenizer, Tokenizer
from proxy.core.models.model_registry import TokenizerSpec
from proxy.errors import ConfigError, GuardError
from proxy.tokenizers.bounded import BOUND_BASE, UnknownBound, bound_terms, bound_tokenizer
from proxy.tokenizers.bundled import litellm_file
from proxy.tokenizers.family_vocabularies import FALLBACK_BOUND, VocabularyMissing, load_vocabulary, vocabulary_file
from proxy.tokenizers.gguf import gguf_encoder
from proxy.tokenizers.malloc import return_freed_memory

if TYPE_CHECKING:
    import tiktoken

_ENCODING_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"


def bundled_encodings_dir() -> Path | None:
    """litellm's folder of tiktoken files, located without importing litellm."""
    return litellm_file("litellm_core_utils", "tokenizers")


def encoding_file_name(name: str) -> str:
    return hashlib.sha1(_ENCODING_URL.format(name=name).encode()).hexdigest()


class TokenizerUnavailable(GuardError, ConfigError):
    """A tokenizer's file is missing or broken. At start (a configured model) it stops the proxy
    as the ConfigError it is; for a model first seen in a request, the error middleware answers
    that request with it (503) as the GuardError it also is, and the proxy keeps serving."""

    status = 503
    error_type = "server_error"
    code = "tokenizer_unavailable"


class Tokenizers:
    """Builds and keeps one tokenizer per spec. Thread-safe; loads each file once, when first asked."""

    def __init__(self, encodings_dirs: Iterable[Path] = ()) -> None:
        dirs = [Path(d) for d in encodings_dirs]
        if os.environ.get("TIKTOKEN_CACHE_DIR"):
            dirs.append(Path(os.environ["TIKTOKEN_CACHE_DIR"]))
        bundled = bundled_encodings_dir()
        if bundled is not None:
            dirs.append(bundled)
        self.encodings_dirs = tuple(dirs)
        self._loaded: dict[TokenizerSpec, Tokenizer] = {}
        # The tokenizers loaded so far, by spec, to read (never loads): what a request's counting
        # looks up on the loop, a plain mapping lookup.
        self.loaded_by_spec: Mapping[TokenizerSpec, Tokenizer] = MappingProxyType(self._loaded)
        self._lock = threading.Lock()
        self._missing: dict[TokenizerSpec, str] = {}  # vocabularies counted with the bound: their package

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

    @property
    def loaded(self) -> tuple[TokenizerSpec, ...]:
        """The specs loaded so far, in the order they were first asked for."""
        return tuple(self._loaded)

    def vocabulary_missing(self, spec: TokenizerSpec) -> str | None:
        """The package whose vocabulary `spec` names and lacks (it is counted with the bound), or None:
        as the load found it, or before a load, as the disk says (no import, milliseconds)."""
        if spec.kind != "vocab":
            return None
        if spec in self._loaded:
            return self._missing.get(spec)
        try:
            vocabulary_file(spec.source)
        except VocabularyMissing as exc:
            return exc.distribution or None
        return None

    def preload(self, specs: Iterable[TokenizerSpec]) -> None:
        for spec in specs:
            self.get(spec)

    def check(self, spec: TokenizerSpec) -> None:
        """Raise `TokenizerUnavailable` when `spec`'s file is not on disk, without loading it
        (milliseconds, where a load takes about half a second)."""
        if spec.kind == "huggingface":
            if not Path(spec.source).is_file():
                raise TokenizerUnavailable(f"Hugging Face tokenizer file {spec.source!r} does not exist")
        elif spec.kind in ("bound", "vocab"):
            try:
                bound_terms(spec.source) if spec.kind == "bound" else vocabulary_file(spec.source)
            except UnknownBound as exc:
                raise TokenizerUnavailable(str(exc)) from None
            except VocabularyMissing as exc:
                if not exc.distribution:  # a name no package ships: the config's mistake
                    raise TokenizerUnavailable(str(exc)) from None
                self._encoding_folder(BOUND_BASE)  # counted with the bound: its encoding must be there
            if spec.kind == "bound":
                self._encoding_folder(BOUND_BASE)
        elif spec.kind != "estimate" and spec not in self._loaded:
            self._encoding_folder(spec.source)

    def _load(self, spec: TokenizerSpec) -> Tokenizer:
        if spec.kind == "estimate":
            ratio, _, mode = spec.source.partition(":")
            return CharEstimateTokenizer(float(ratio), "byte" if mode == "bytes" else "char")
        if spec.kind == "huggingface":
            encode, sliceable = _hf_encoder(spec.source)
            return EncoderTokenizer(
                f"hf:{Path(spec.source).name}",
                encode,
                spec.multiplier,
                source_id=tokenizer_file_id(spec.source),
                sliceable=sliceable,
            )
        if spec.kind == "vocab":  # a model family's own vocabulary, shipped in a package (proxy.tokenizers)
            try:
                encode = load_vocabulary(spec.source)
            except VocabularyMissing as exc:
                if not exc.distribution:
                    raise TokenizerUnavailable(str(exc)) from None
                self._missing[spec] = exc.distribution
                return self._load(TokenizerSpec("bound", FALLBACK_BOUND, spec.multiplier))
            return EncoderTokenizer(spec.source, encode, spec.multiplier, _chunked(encode), batch_from_chars=_PARALLEL)
        if spec.kind == "bound":  # an upper bound over cl100k_base (proxy.core.counting.bound)
            base = self._tiktoken_encoding(BOUND_BASE)
            try:
                return bound_tokenizer(spec.source, spec.multiplier, base, _chunked(base.encode_ordinary), _PARALLEL)
            except UnknownBound as exc:
                raise TokenizerUnavailable(str(exc)) from None
        encoding = self._tiktoken_encoding(spec.source)
        encode_all = _chunked(encoding.encode_ordinary)
        return EncoderTokenizer(
            spec.source, encoding.encode_ordinary, spec.multiplier, encode_all, batch_from_chars=_PARALLEL
        )

    def _encoding_folder(self, name: str) -> Path:
        """The first folder searched that holds encoding `name`'s file."""
        file_name = encoding_file_name(name)
        folder = next((d for d in self.encodings_dirs if (d / file_name).is_file()), None)
        if folder is None:
            searched = ", ".join(str(d) for d in self.encodings_dirs) or "no folder"
            raise TokenizerUnavailable(
                f"tiktoken encoding {name!r} is not on disk (looked for {file_name} in {searched}); "
                "install litellm, or set tokenizers.encodings_dir to a folder holding it"
            )
        return folder

    def _tiktoken_encoding(self, name: str) -> tiktoken.Encoding:
        folder = self._encoding_folder(name)
        with _ENCODINGS_LOCK:
            encoding = _ENCODINGS.get((name, folder))
            if encoding is None:
                encoding = _ENCODINGS[(name, folder)] = _load_tiktoken(name, folder)
        return encoding


# Loaded encodings, one per (name, folder) for the whole process, as tiktoken's own registry keeps them.
_ENCODINGS: dict[tuple[str, Path], tiktoken.Encoding] = {}
_ENCODINGS_LOCK = threading.Lock()


def _load_tiktoken(name: str, folder: Path) -> tiktoken.Encoding:
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext import openai_public  # type: ignore[import-untyped]  # tiktoken ships no stubs for it

    constructor = openai_public.ENCODING_CONSTRUCTORS.get(name)
    if constructor is None:
        known = ", ".join(sorted(openai_public.ENCODING_CONSTRUCTORS))
        raise TokenizerUnavailable(f"unknown tiktoken encoding {name!r}; known: {known}")
    try:
        # The constructor's reader is swapped for ours for this call only (callers hold
        # _ENCODINGS_LOCK): the same file, hash check and ranks (a test compares them), no download.
        openai_public.load_tiktoken_bpe = _ranks_reader(folder)
        try:
            spec = constructor()
        finally:
            openai_public.load_tiktoken_bpe = load_tiktoken_bpe
        encoding = tiktoken.Encoding(**spec)
    except Exception as exc:  # a corrupt file: fail with the reason
        raise TokenizerUnavailable(f"tiktoken encoding {name!r} failed to load from {folder}: {exc}") from exc
    # The Rust encoder copied the ranks; the Python dict would only serve pickling (see above).
    spec["mergeable_ranks"].clear()
    return_freed_memory()  # glibc keeps the heap the ranks dict held otherwise: ~4 MB
    return encoding


def _ranks_reader(folder: Path) -> Callable[..., dict[bytes, int]]:
    """tiktoken's `load_tiktoken_bpe(blobpath, expected_hash)`, reading `folder` only.

    tiktoken's own reader deletes a file whose hash does not match and downloads it again; this
    one says the file is corrupt. It also parses in one pass of C loops: twice as fast, and
    holding the GIL throughout, so that no object the event loop allocates meanwhile lands among
    the 200,000 short-lived ones and keeps their memory from being handed back (17 MB for
    o200k_base when it loads beside a serving loop)."""

    def read(blobpath: str, expected_hash: str | None = None) -> dict[bytes, int]:
        path = folder / hashlib.sha1(blobpath.encode()).hexdigest()
        contents = path.read_bytes()
        if expected_hash and hashlib.sha256(contents).hexdigest() != expected_hash:
            raise ValueError(f"{path} is not the published file (its SHA-256 differs): corrupt or truncated")
        parts = contents.split()
        lines = contents.count(b"\n") + (0 if contents.endswith(b"\n") else 1)
        if len(parts) != 2 * lines:
            raise ValueError(f"{path} is not one `token rank` pair per line")
        return dict(zip(map(binascii.a2b_base64, parts[0::2]), map(int, parts[1::2]), strict=True))

    return read


# Threads that do a large body's work (parse, count, plan) run below the event loop's priority,
# so that a core the machine shares goes to the loop's small requests first (Linux schedules
# threads one by one; another system keeps its one priority per process).
BACKGROUND_NICENESS = 5


def lower_thread_priority() -> None:
    """Run the calling thread `BACKGROUND_NICENESS` steps below its process (a pool's initializer)."""
    with contextlib.suppress(OSError, AttributeError):  # no per-thread priority here: the same one
        niceness = os.getpriority(os.PRIO_PROCESS, 0) + BACKGROUND_NICENESS
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)


# tiktoken releases the GIL while it encodes: a request's many texts, split into one contiguous
# chunk per core, count in about half the time on two cores. One pool serves every request; only
# texts of a large body use it, so its threads run at the background priority too.
_WORKERS = max(1, min(4, os.cpu_count() or 1))
_POOL = ThreadPoolExecutor(
    max_workers=_WORKERS, thread_name_prefix="context-guard-encode", initializer=lower_thread_priority
)
# Below this many characters, threads cost more than they save: the tokenizer encodes such a batch
# text by text itself (`EncoderTokenizer.batch_from_chars`), and never with one thread.
_PARALLEL = 256 * 1024 if _WORKERS > 1 else sys.maxsize


def _chunked(encode: Callable[[str], list[int]]) -> Callable[[list[str]], list[list[int]]]:
    """`encode` over many texts at once, in one contiguous chunk per thread of the pool."""

    def encode_all(texts: list[str]) -> list[list[int]]:
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


def _hf_encoder(path: str) -> tuple[Callable[[str], list[int]], bool]:
    """`huggingface:<path>`: a `tokenizer.json` file, or the vocabulary inside a `.gguf` model file;
    and whether its texts may be counted in slices (`proxy.core.counting.bound`): a byte-level BPE
    vocabulary whose normaliser is none or NFC, as every GGUF vocabulary read here is."""
    from tokenizers import Tokenizer as HfTokenizer

    if not Path(path).is_file():
        raise TokenizerUnavailable(f"Hugging Face tokenizer file {path!r} does not exist")
    if path.lower().endswith(".gguf"):
        try:
            return gguf_encoder(path), True
        except (OSError, ValueError, KeyError, struct.error) as exc:
            raise TokenizerUnavailable(f"the vocabulary of GGUF file {path!r} failed to load: {exc}") from exc
    try:
        tokenizer = HfTokenizer.from_file(path)
    except Exception as exc:
        raise TokenizerUnavailable(f"Hugging Face tokenizer {path!r} failed to load: {exc}") from exc

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    return encode, hf_sliceable(tokenizer.to_str())


def hf_sliceable(config: str) -> bool:
    """Whether a `tokenizer.json`'s texts count exactly in slices cut as `proxy.core.counting.bound` cuts
    them: its pre-tokeniser ends in `ByteLevel` (regular-expression splits of GPT-2's kind, or
    `ByteLevel`'s own) and its normaliser is none or NFC. SentencePiece-style vocabularies (a
    `Metaspace` or no pre-tokeniser: BPE runs over the whole text) are encoded whole."""
    import json

    try:
        parsed = json.loads(config)
    except ValueError:
        return False
    normalizer, pre = parsed.get("normalizer"), parsed.get("pre_tokenizer")
    if isinstance(normalizer, dict) and normalizer.get("type") == "Sequence":
        inner = normalizer.get("normalizers") or []
        normalizer = inner[0] if len(inner) == 1 else (None if not inner else normalizer)
    if normalizer is not None and normalizer.get("type") != "NFC":
        return False
    if not isinstance(pre, dict):
        return False
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [step.get("type") for step in steps if isinstance(step, dict)]
    isolated = all(
        step.get("behavior") == "Isolated" and not step.get("invert")
        for step in steps
        if isinstance(step, dict) and step.get("type") == "Split"
    )
    return bool(kinds) and kinds[-1] == "ByteLevel" and set(kinds) <= {"Split", "ByteLevel", "Digits"} and isolated
