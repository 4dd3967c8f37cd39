"""Writes tests/data/families/gemma4_counts.json: Gemma 4's real token count of each corpus text.

Gemma's vocabulary ships in no package the guard installs; llama.cpp's source distribution carries
it as a vocabulary GGUF (models/ggml-vocab-gemma-4.gguf, 15 MB, with llama.cpp's test vectors beside
it). Read as a byte-fallback BPE over `▁`-for-space text, it reproduces all 46 of those vectors (the
script checks them before it writes). The counts are committed so that the bound's test needs no
15 MB file:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/llama-sdist
    tar xzf /tmp/llama-sdist/llama_cpp_python-0.3.36.tar.gz -C /tmp
    python tests/data/families/make_gemma_counts.py /tmp/llama_cpp_python-0.3.36/vendor/llama.cpp/models
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent.parent.parent))

from tokenizers import Tokenizer, models, normalizers  # noqa: E402

from proxy.gguf_vocab import read_metadata  # noqa: E402


def gemma4(folder: Path) -> Tokenizer:
    metadata = read_metadata(folder / "ggml-vocab-gemma-4.gguf")
    tokens: list[str] = metadata["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in metadata["tokenizer.ggml.merges"]]
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tokenizer.normalizer = normalizers.Replace(" ", "\u2581")
    return tokenizer


def check(tokenizer: Tokenizer, folder: Path) -> int:
    inputs = (folder / "ggml-vocab-gemma-4.gguf.inp").read_text("utf-8").split("\n__ggml_vocab_test__\n")
    outputs = (folder / "ggml-vocab-gemma-4.gguf.out").read_text("utf-8").strip().split("\n")
    for text, expected in zip(inputs, outputs, strict=False):
        got = tokenizer.encode(text, add_special_tokens=False).ids
        if got != [int(i) for i in expected.split()]:
            raise SystemExit(f"llama.cpp's vector {text[:40]!r}: {got[:10]} != {expected[:60]}")
    return len(outputs)


if __name__ == "__main__":
    folder = Path(sys.argv[1])
    tokenizer = gemma4(folder)
    vectors = check(tokenizer, folder)
    corpus = json.loads((HERE / "corpus.json").read_text("utf-8"))
    counts = {kind: len(tokenizer.encode(text, add_special_tokens=False).ids) for kind, text in sorted(corpus.items())}
    out = HERE / "gemma4_counts.json"
    out.write_text(json.dumps({"vectors_checked": vectors, "counts": counts}, indent=1) + "\n", "utf-8")
    print(f"{vectors} of llama.cpp's vectors reproduced; wrote {out}")
