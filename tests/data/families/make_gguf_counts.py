"""Writes tests/data/families/gguf_counts.json: the real token count of each corpus text for the
vocabularies that ship in no package the guard installs, Gemma 4's and Llama 2's.

llama.cpp's source distribution carries them as vocabulary GGUFs (models/ggml-vocab-gemma-4.gguf,
15 MB, and ggml-vocab-llama-spm.gguf, Llama 2's SentencePiece vocabulary, 0.7 MB), each with
llama.cpp's test vectors beside it. Read with the `tokenizers` library (Gemma 4: a byte-fallback
BPE over its merges, `▁` for a space; Llama 2: the same with merges derived from the pieces'
scores, as transformers converts a SentencePiece model, and a leading `▁`), both reproduce all 46
of their vectors: the script checks them before it writes. The counts are committed so that the
bounds' tests need no GGUF file:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/llama-sdist
    tar xzf /tmp/llama-sdist/llama_cpp_python-0.3.36.tar.gz -C /tmp
    python tests/data/families/make_gguf_counts.py /tmp/llama_cpp_python-0.3.36/vendor/llama.cpp/models
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent.parent.parent))

from tokenizers import Tokenizer, models, normalizers  # noqa: E402

from proxy.tokenizers.gguf import read_metadata  # noqa: E402

SPACE = "\u2581"


def gemma4(path: Path) -> Tokenizer:
    metadata = read_metadata(path)
    vocab = {token: i for i, token in enumerate(metadata["tokenizer.ggml.tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tokenizer.normalizer = normalizers.Replace(" ", SPACE)
    return tokenizer


def llama_spm(path: Path) -> Tokenizer:
    metadata = read_metadata(path)
    tokens, scores, types = (metadata[f"tokenizer.ggml.{k}"] for k in ("tokens", "scores", "token_type"))
    vocab = {token: i for i, token in enumerate(tokens)}
    splits = [
        (piece[:k], piece[k:], i)
        for piece, i in vocab.items()
        if types[i] == 1
        for k in range(1, len(piece))
        if piece[:k] in vocab and piece[k:] in vocab
    ]
    splits.sort(key=lambda s: (-scores[s[2]], vocab[s[0]], vocab[s[1]]))
    merges = [(a, b) for a, b, _ in splits]
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    return tokenizer


READERS = {"gemma-4": gemma4, "llama-spm": llama_spm}


def check(tokenizer: Tokenizer, path: Path) -> int:
    inputs = Path(f"{path}.inp").read_text("utf-8").split("\n__ggml_vocab_test__\n")
    outputs = Path(f"{path}.out").read_text("utf-8").strip().split("\n")
    for text, expected in zip(inputs, outputs, strict=False):
        got = tokenizer.encode(text, add_special_tokens=False).ids
        if got != [int(i) for i in expected.split()]:
            raise SystemExit(f"{path.name}: llama.cpp's vector {text[:40]!r}: {got[:10]} != {expected[:60]}")
    return len(outputs)


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    corpus = json.loads((HERE / "corpus.json").read_text("utf-8"))
    result: dict[str, dict[str, int]] = {"vectors_checked": {}}
    for name, reader in READERS.items():
        path = folder / f"ggml-vocab-{name}.gguf"
        tokenizer = reader(path)
        result["vectors_checked"][name] = check(tokenizer, path)
        result[name] = {k: len(tokenizer.encode(t, add_special_tokens=False).ids) for k, t in sorted(corpus.items())}
    out = HERE / "gguf_counts.json"
    out.write_text(json.dumps(result, indent=1) + "\n", "utf-8")
    print(f"llama.cpp's vectors reproduced: {result['vectors_checked']}; wrote {out}")
