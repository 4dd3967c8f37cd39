"""The context windows open-weight models are published with, and which map provider is each maker.

A model map lists an open model once per host that serves it (`deepinfra/...`, `novita/...`,
`together_ai/...`), each with the window *that host* runs it with: Novita serves Llama 3.1 8B with
16,384 tokens, the model's own window is 128k. A name that says no host (`Llama-3.1-8B-Instruct`,
`meta-llama/Llama-3.1-8B-Instruct`) is the model itself, so it takes the window its maker
documents (the model card; the config's `max_position_embeddings` where the card says "128k"), or
the maker's own API entry in the map. The upstream that actually serves it may state a smaller
one (vLLM, llama.cpp, Ollama are asked at start), and that one wins over this table.

Windows that need a switch to reach (Qwen's YaRN "up to 131,072") are not the default: the
window here is what the released config runs with.
"""

from __future__ import annotations

import fnmatch

# (pattern on the lower-cased model name without organisation, window, source). First match wins.
DOCUMENTED_WINDOWS: tuple[tuple[str, int, str], ...] = (
    ("*llama-4-scout*", 10_000_000, "huggingface.co/meta-llama/Llama-4-Scout-17B-16E-Instruct (10M)"),
    ("*llama-4-maverick*", 1_000_000, "huggingface.co/meta-llama/Llama-4-Maverick-17B-128E-Instruct (1M)"),
    ("*llama-3.[123]-*", 131_072, "huggingface.co/meta-llama/Llama-3.1-8B-Instruct (128k, config 131072)"),
    ("*llama-3-[0-9]*", 8_192, "huggingface.co/meta-llama/Meta-Llama-3-8B-Instruct (8k)"),
    ("*llama-2-*", 4_096, "huggingface.co/meta-llama/Llama-2-7b-chat-hf (config 4096)"),
    ("qwen3-coder-*", 262_144, "huggingface.co/Qwen/Qwen3-Coder-480B-A35B-Instruct (262,144 natively)"),
    ("qwen3-*-2507*", 262_144, "huggingface.co/Qwen/Qwen3-235B-A22B-Instruct-2507 (262,144 natively)"),
    ("qwen3-*", 32_768, "huggingface.co/Qwen/Qwen3-8B (32,768 natively; 131,072 only with YaRN)"),
    ("qwen2.5-*", 32_768, "huggingface.co/Qwen/Qwen2.5-7B-Instruct (config 32,768; 131,072 only with YaRN)"),
    ("mistral-7b-instruct-v0.1*", 8_192, "huggingface.co/mistralai/Mistral-7B-Instruct-v0.2 (v0.1: 8k)"),
    ("mistral-7b-instruct-v0.[23]*", 32_768, "huggingface.co/mistralai/Mistral-7B-Instruct-v0.2 (32k)"),
    ("mixtral-8x7b*", 32_768, "mistral.ai/news/mixtral-of-experts (32k)"),
    ("mixtral-8x22b*", 65_536, "mistral.ai/news/mixtral-8x22b (64k)"),
    ("mistral-nemo*", 128_000, "mistral.ai/news/mistral-nemo (128k)"),
    ("deepseek-r1-distill-*", 128_000, "huggingface.co/deepseek-ai/DeepSeek-R1 (128K)"),
    ("deepseek-r1*", 128_000, "huggingface.co/deepseek-ai/DeepSeek-R1 (128K)"),
    ("deepseek-v3*", 128_000, "huggingface.co/deepseek-ai/DeepSeek-V3 (128K)"),
    ("gemma-2-*", 8_192, "ai.google.dev/gemma/docs/core/model_card_2 (8192)"),
    ("gemma-3n-*", 32_768, "ai.google.dev/gemma/docs/gemma-3n/model_card (32K)"),
    ("gemma-3-1b*", 32_768, "ai.google.dev/gemma/docs/core/model_card_3 (1B: 32K)"),
    ("gemma-3-*", 131_072, "ai.google.dev/gemma/docs/core/model_card_3 (128K, config 131072)"),
    ("phi-3*-4k*", 4_096, "huggingface.co/microsoft/Phi-3-mini-4k-instruct (4K)"),
    ("phi-3*-128k*", 131_072, "huggingface.co/microsoft/Phi-3-mini-128k-instruct (128K)"),
    ("phi-4", 16_384, "huggingface.co/microsoft/phi-4 (16K)"),
)

# The map provider that is the model's maker, by the organisation that publishes its weights.
MAKER_PROVIDERS: dict[str, str] = {
    "meta-llama": "meta_llama",
    "mistralai": "mistral",
    "deepseek-ai": "deepseek",
    "qwen": "dashscope",
    "google": "gemini",
}
# ... and by the model name's own family, for names that carry no organisation.
_MAKER_BY_NAME: tuple[tuple[str, str], ...] = (
    ("*llama*", "meta_llama"),
    ("*mistral*", "mistral"),
    ("*mixtral*", "mistral"),
    ("deepseek*", "deepseek"),
    ("qwen*", "dashscope"),
    ("gemma*", "gemini"),
)


def documented_window(model: str) -> tuple[int, str] | None:
    """The window `model`'s maker documents, with its source; `model` is lower-cased, without org."""
    for pattern, window, source in DOCUMENTED_WINDOWS:
        if fnmatch.fnmatchcase(model, pattern):
            return window, source
    return None


def maker_provider(organisation: str, model: str) -> str | None:
    """The map provider that makes `model` (lower-cased; `organisation` may be empty)."""
    maker = MAKER_PROVIDERS.get(organisation)
    if maker is not None:
        return maker
    return next((provider for pattern, provider in _MAKER_BY_NAME if fnmatch.fnmatchcase(model, pattern)), None)
