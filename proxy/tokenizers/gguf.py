"""A Hugging Face `tokenizers` tokenizer built from the vocabulary inside a GGUF model file.

A llama.cpp server runs a GGUF file, and that file carries its tokenizer: the token strings, the
BPE merges and the name of the pre-tokenizer (`tokenizer.ggml.pre`). Reading them gives the
guard the backend's exact vocabulary with no network and no extra download.

Only the metadata at the head of the file is read (the tensors, most of its size, never are),
with a small reader of the GGUF key-value format written here: the `gguf` package reads
metadata through numpy and takes tens of seconds on a 49k-token vocabulary.

Supported, each checked against the test vectors llama.cpp ships with its vocabularies
(tests/tokenizers/test_gguf_vocabs.py):
- byte-level BPE (`tokenizer.ggml.model = gpt2`: GPT-2, Llama 3, Qwen 2 and 3.5, DeepSeek LLM and
  Coder, Falcon, SmolLM, StarCoder, Command-R and most current models) with the pre-tokenizers
  listed in `PRE_TOKENIZERS`, which copy llama.cpp's own (src/llama-vocab.cpp), including which of
  them look a whole pre-tokenized word up before merging (`ignore_merges`: Llama 3);
- SentencePiece (`llama`: Llama 2, Mistral v1, Phi-3, Baichuan), rebuilt as the BPE its scores
  describe, over text whose spaces are `▁` and that starts with one, falling back to `<0xXX>` bytes;
- Gemma 4's (`gemma4`): BPE on raw UTF-8 with `▁` for spaces, split on newlines only, byte fallback.
Anything else is a `ValueError` naming what the file has and what is supported.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
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
_QWEN35 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LLM = (  # the C++ source's classes, escaped: several of their characters change under NFC
    "[\r\n]",
    "\\s?["
    "A-Za-z\xb5\xc0-\xd6\xd8-\xf6\xf8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-"
    "\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-"
    "\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d"
    "\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-"
    "\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d"
    "\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4"
    "\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f"
    "\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2"
    "\U000118a0-\U000118df\U0001e900-\U0001e943"
    "]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    _CJK,
    "\\p{N}+",
)
_DEEPSEEK_CODER = ("[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", _CJK, "\\p{N}")
_FALCON = (
    "[\\p{P}\\$\\+<=>\\^~\\|`]+",
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
    "[0-9][0-9][0-9]",
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
    **dict.fromkeys(("qwen2", "stablelm2", "hunyuan", "deepseek-r1-qwen", "megrez"), _split(_QWEN2)),
    "qwen35": _split(_QWEN35),
    "deepseek-llm": _split(*_DEEPSEEK_LLM),
    "deepseek-coder": _split(*_DEEPSEEK_CODER),
    "falcon": _split(*_FALCON),
}
# Pre-tokenizers after which llama.cpp takes a whole word that is a token as it is, merging nothing.
IGNORE_MERGES = frozenset(("llama3", "llama-v3", "llama-bpe"))


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
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    types: list[int] = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocabulary = Vocabulary(tokens, types)
    if model == "gpt2":
        pre = metadata.get("tokenizer.ggml.pre", "default")
        if pre not in PRE_TOKENIZERS:
            known = ", ".join(sorted(PRE_TOKENIZERS))
            raise ValueError(f"{source} uses the pre-tokenizer {pre!r}, which is not supported; known: {known}")
        merges = _pairs(metadata.get("tokenizer.ggml.merges") or [])
        document = _document(vocabulary, merges, PRE_TOKENIZERS[pre], None, byte_level=True)
        document["model"]["ignore_merges"] = pre in IGNORE_MERGES
    elif model == "llama":  # SentencePiece: the BPE its scores describe, as llama.cpp's `llm_tokenizer_spm`
        scores: list[float] = metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
        prefix = metadata.get("tokenizer.ggml.add_space_prefix", True)
        steps: list[dict[str, Any]] = [{"type": "Prepend", "prepend": "▁"}] if prefix else []
        steps.append({"type": "Replace", "pattern": {"String": " "}, "content": "▁"})
        normalizer: dict[str, Any] = {"type": "Sequence", "normalizers": steps}
        document = _document(vocabulary, _spm_merges(tokens, types, scores), None, normalizer, byte_level=False)
    elif model == "gemma4":  # BPE on raw UTF-8 with spaces as `▁`, split only into lines and runs of newlines
        normalizer = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        lines = {"type": "Split", "pattern": {"Regex": "[^\\n]+|[\\n]+"}, "behavior": "Isolated", "invert": False}
        merges = _pairs(metadata.get("tokenizer.ggml.merges") or [])
        document = _document(vocabulary, merges, lines, normalizer, byte_level=False)
    else:
        raise ValueError(
            f"{source} has a {model!r} tokenizer; supported: byte-level BPE ('gpt2'), SentencePiece ('llama'), 'gemma4'"
        )
    return json.dumps(document, ensure_ascii=False)


@dataclass(frozen=True)
class Vocabulary:
    """A GGUF vocabulary: its tokens in id order and each one's type (`tokenizer.ggml.token_type`:
    1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte)."""

    tokens: list[str]
    types: list[int]


def _document(
    vocabulary: Vocabulary,
    merges: list[tuple[str, str]],
    pre_tokenizer: dict[str, Any] | None,
    normalizer: dict[str, Any] | None,
    byte_level: bool,
) -> dict[str, Any]:
    # Control (3) and user-defined (4) tokens are matched whole, as llama.cpp does when it renders a template.
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    added = [
        {"id": i, "content": token, **flags}
        for i, (token, kind) in enumerate(zip(vocabulary.tokens, vocabulary.types, strict=False))
        if kind in (3, 4)
    ]
    byte_decoder = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    vocab: dict[str, int] = {}
    for i, token in enumerate(vocabulary.tokens):
        vocab.setdefault(token, i)  # a token listed twice keeps its first id, as llama.cpp's lookup does
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": None,
        "decoder": byte_decoder if byte_level else None,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": not byte_level,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },
    }


def _pairs(merges: list[str]) -> list[tuple[str, str]]:
    """GGUF merges ("left right") as pairs, split at the first space after the first character as
    llama.cpp splits them (a left part may itself be a space)."""
    pairs = []
    for merge in merges:
        cut = merge.find(" ", 1)
        pairs.append((merge[:cut], merge[cut + 1 :]) if cut > 0 else (merge, ""))
    return pairs


def _spm_merges(tokens: list[str], types: list[int], scores: list[float]) -> list[tuple[str, str]]:
    """The merges of a SentencePiece vocabulary: every split of a normal token into two tokens,
    ranked by the merged token's score (highest first), then by the parts' ids. llama.cpp's
    `llm_tokenizer_spm` merges the adjacent pair whose joined text is the best-scored token, the
    leftmost on ties: the same order."""
    ids = {token: i for i, token in reversed(list(enumerate(tokens)))}
    ranked: list[tuple[float, int, int, str, str]] = []
    for token, kind, score in zip(tokens, types, scores, strict=False):
        if kind != 1 or len(token) < 2:
            continue
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids and types[ids[left]] == 1 and types[ids[right]] == 1:
                ranked.append((-score, ids[left], ids[right], left, right))
    ranked.sort()
    return [(left, right) for _, _, _, left, right in ranked]


def gguf_encoder(path: str) -> Callable[[str], list[int]]:
    """An `encode(text) -> ids` function for the vocabulary of the GGUF file at `path`."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json(read_metadata(Path(path)), path))

    def encode(text: str) -> list[int]:
        ids: list[int] = tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    return encode


# Where scripts/install-vocabs.sh puts llama.cpp's vocabulary GGUFs (and their test vectors).
VOCABS_VERSION = "0.3.36"


def vocabs_dir() -> Path:
    """The directory of llama.cpp's shipped vocabularies: `$CONTEXT_GUARD_VOCABS`, else the cache
    directory scripts/install-vocabs.sh fills."""
    configured = os.environ.get("CONTEXT_GUARD_VOCABS")
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "context-guard" / f"llama-vocabs-{VOCABS_VERSION}"


def shipped_vocab(name: str) -> Path | None:
    """llama.cpp's vocabulary `name` (`gemma-4`, `qwen35`, `llama-bpe`, ...) if installed, else None.
    Each of them encodes exactly as llama.cpp does on the test vectors shipped with it."""
    path = vocabs_dir() / f"ggml-vocab-{name}.gguf"
    return path if path.is_file() else None
