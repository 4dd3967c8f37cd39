#!/usr/bin/env bash
# Installs llama.cpp's vocabulary GGUFs and their tokenizer test vectors (models/ggml-vocab-*.gguf,
# .gguf.inp, .gguf.out) for tests/tokenizers/test_gguf_vocabs.py, from llama-cpp-python's source distribution on
# the package index (it vendors llama.cpp). Only those files are kept, in
# ~/.cache/context-guard/llama-vocabs-<version>/ (about 30 MB). Idempotent: a directory already holding
# them is left alone and the script returns at once. Prints the directory on its last line.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/context-guard"
TARGET="$CACHE_DIR/llama-vocabs-$VERSION"
PIP="${PIP:-}"
if [ -z "$PIP" ]; then
    if [ -x .venv/bin/pip ]; then PIP=.venv/bin/pip; else PIP="python3 -m pip"; fi
fi

if [ -f "$TARGET/.complete" ]; then
    echo "$TARGET"
    exit 0
fi

mkdir -p "$CACHE_DIR"
WORK="$(mktemp -d "$CACHE_DIR/llama-sdist.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
echo "downloading llama-cpp-python==$VERSION's source distribution (77 MB) for its vocabularies" >&2
$PIP download --quiet --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$WORK" >&2
SDIST="$(ls "$WORK"/llama_cpp_python-*.tar.gz)"
rm -rf "$TARGET.partial" && mkdir -p "$TARGET.partial"
tar -xzf "$SDIST" -C "$TARGET.partial" --strip-components=4 --wildcards \
    "llama_cpp_python-$VERSION/vendor/llama.cpp/models/ggml-vocab-*"
touch "$TARGET.partial/.complete"
rm -rf "$TARGET" && mv "$TARGET.partial" "$TARGET"
echo "$TARGET"
