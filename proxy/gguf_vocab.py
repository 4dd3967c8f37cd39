"""A Hugging Face `tokenizers` tokenizer built from the vocabulary inside a GGUF model file.

A llama.cpp server runs a GGUF file, and that file carries its tokenizer: the token strings, the
BPE merges and the name of the pre-tokenizer (`tokenizer.ggml.pre`). Reading them gives the
guard the backend's exact vocabulary with no network and no extra download.

Only the metadata at the head of the file is read (the tensors, most of its size, never are),
with a small reader of the GGUF key-value format written here: the `gguf` package reads
metadata through numpy and takes tens of seconds on a 49k-token vocabulary.

Supported: byte-level BPE vocabularies (`tokenizer.ggml.model = gpt2`, the format of GPT-2,
Llama 3, Qwen, SmolLM, StarCoder and most current models) with the pre-tokenizers listed in
`PRE_TOKENIZERS`, which copy llama.cpp's own (src/llama-vocab.cpp). Anything else is a
`ValueError` naming what the file has and what is supported.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

GGUF_MAGIC = b"GGUF"
_SCALARS: dict[int, struct.Struct] = {
    0: struct.Struct("<B"),
    1: struct.Struct("<b"),
    2: struct.Struct("<H"),
    3: struct.Struct("<h"),
    4: struct.Struct("<I"),
    5: struct.Struct("<i"),
    6: struct.Struct("<f"),
    7: struct.Struct("<?"),
    10: struct.Struct("<Q"),
    11: struct.Struct("<q"),
    12: struct.Struct("<d"),
}
_STRING, _ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_WANTED = ("tokenizer.ggml.",)  # keys whose values are kept; others are skipped unread

# llama.cpp's pre-tokenizer regexes by `tokenizer.ggml.pre`, as tokenizers' pre-tokenizer configs.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _split(*patterns: str) -> dict[str, Any]:
    steps: list[dict[str, Any]] = [
        {"type": "Split", "pattern": {"Regex": p}, "behavior": "Isolated", "invert": False} for p in patterns
    ]
    steps.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False})
    return {"type": "Sequence", "pretokenizers": steps}


PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    **dict.fromkeys(("default", "gpt2", "gpt-2", "mpt", "olmo", "jais"), _split(_GPT2)),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"), _split(r"\p{N}", _GPT2)
    ),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "dbrx", "smaug-bpe"), _split(_LLAMA3)),
    **dict.fromkeys(("qwen2", "stablelm2", "hunyuan"), _split(_QWEN2)),
}


def read_metadata(path: Path, prefixes: tuple[str, ...] = _WANTED) -> dict[str, Any]:
    """The key-value metadata of a GGUF file whose keys start with one of `prefixes`."""
    with path.open("rb") as f:
        if f.read(4) != GGUF_MAGIC:
            raise ValueError(f"{path} is not a GGUF file")
        (version,) = _U32.unpack(f.read(4))
        if version not in (2, 3):
            raise ValueError(f"{path} is GGUF version {version}; versions 2 and 3 are supported")
        f.read(8)  # the tensor count
        (count,) = _U64.unpack(f.read(8))
        metadata: dict[str, Any] = {}
        for _ in range(count):
            key = _string(f)
            (kind,) = _U32.unpack(f.read(4))
            keep = key.startswith(prefixes)
            value = _value(f, kind, keep)
            if keep:
                metadata[key] = value
        return metadata


def _string(f: IO[bytes]) -> str:
    (size,) = _U64.unpack(f.read(8))
    return f.read(size).decode("utf-8", "surrogateescape")


def _value(f: IO[bytes], kind: int, keep: bool) -> Any:
    if kind == _STRING:
        return _string(f)
    if kind == _ARRAY:
        (item_kind,) = _U32.unpack(f.read(4))
        (length,) = _U64.unpack(f.read(8))
        scalar = _SCALARS.get(item_kind)
        if scalar is not None:  # a run of fixed-size items: read (or skip) in one go
            raw = f.read(scalar.size * length)
            return [v for (v,) in scalar.iter_unpack(raw)] if keep else None
        return [_value(f, item_kind, keep) for _ in range(length)]
    scalar = _SCALARS.get(kind)
    if scalar is None:
        raise ValueError(f"unknown GGUF value type {kind}")
    return scalar.unpack(f.read(scalar.size))[0]


def tokenizer_json(metadata: dict[str, Any], source: str = "the GGUF file") -> str:
    """A `tokenizer.json` document for the vocabulary in `metadata` (see `read_metadata`)."""
    model = metadata.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ValueError(f"{source} has a {model!r} tokenizer; only byte-level BPE ('gpt2') vocabularies are supported")
    pre = metadata.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        known = ", ".join(sorted(PRE_TOKENIZERS))
        raise ValueError(f"{source} uses the pre-tokenizer {pre!r}, which is not supported; known: {known}")
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    merges: list[str] = metadata.get("tokenizer.ggml.merges") or []
    types: list[int] = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    # Control (3) and user-defined (4) tokens are matched whole, as llama.cpp does when it renders a template.
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    added = [
        {"id": i, "content": token, **flags}
        for i, (token, kind) in enumerate(zip(tokens, types, strict=False))
        if kind in (3, 4)
    ]
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {t: i for i, t in enumerate(tokens)},
            "merges": merges,
        },
    }
    return json.dumps(document, ensure_ascii=False)


def gguf_encoder(path: str) -> Callable[[str], list[int]]:
    """An `encode(text) -> ids` function for the vocabulary of the GGUF file at `path`."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json(read_metadata(Path(path)), path))

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    return encode
