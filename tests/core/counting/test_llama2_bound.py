"""`bound:open`, which counts Llama 2 and Code Llama (and every family whose vocabulary is
missing), is never under Llama 2's real vocabulary, nor any shipped vocabulary, on the texts the
corpus holds too few of: minified JSON of the shapes tool results take (`[true,false,null]`,
camelCase keys, escaped newlines, coordinates) and Korean prose of common and rare syllables.

Llama 2's vocabulary is llama.cpp's `llama-spm` GGUF (scripts/install-vocabs.sh installs it from
llama-cpp-python's source distribution; it reproduces llama.cpp's test vectors,
tests/test_gguf_vocabs.py), read here as ground truth."""

from __future__ import annotations

import functools
import json
import os
import random
import string
from collections.abc import Callable

import pytest

from proxy.core.models.model_registry import TokenizerSpec
from proxy.tokenizers.family_vocabularies import VOCABULARIES, load_vocabulary
from proxy.tokenizers.gguf import gguf_encoder, shipped_vocab, vocabs_dir
from proxy.tokenizers.vocabularies import Tokenizers

WORDS = ["id", "name", "type", "value", "status", "ok", "user", "data", "items", "count", "error", "price", "url"]
SYLLABLES = "가나다라마바사아자차카타파하는이의에를은로으과와한다있고했것수들그저우리서울대민국정부경제회문화시간람생각지않"


def _minified(value: object, ascii_only: bool = True) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=ascii_only)


def _texts() -> dict[str, str]:
    rnd = random.Random(38)
    texts = {
        "json_bools": _minified([rnd.choice([True, False, None]) for _ in range(400)]),
        "json_short_pairs": _minified([{rnd.choice(WORDS): rnd.choice(WORDS) for _ in range(5)} for _ in range(60)]),
        "json_camel_keys": _minified(
            [{"userId": i, "firstName": "Ann", "lastName": "Lee", "isActive": i % 2 == 0} for i in range(50)]
        ),
        "json_escaped_newlines": _minified(["line one\nline two\n\tindented"] * 60),
        "json_markup": _minified({"html": '<div class="a"><span>x</span></div>' * 40}),
        "json_coordinates": _minified(
            [{"lat": round(rnd.uniform(-90, 90), 6), "lon": round(rnd.uniform(-180, 180), 6)} for _ in range(60)]
        ),
        "json_korean": _minified([{"이름": "김철수", "나이": 30, "도시": "부산"}] * 40, ascii_only=False),
        "json_letters": _minified(["".join(rnd.choices(string.ascii_letters, k=3)) for _ in range(300)]),
    }
    for i in range(3):
        texts[f"korean_rare_{i}"] = "".join(
            chr(rnd.randint(0xAC00, 0xD7A3)) if rnd.random() > 0.2 else " " for _ in range(400)
        )
        texts[f"korean_common_{i}"] = " ".join(
            "".join(rnd.choices(SYLLABLES, k=rnd.randint(1, 5))) + rnd.choice(["", ".", ",", " 2024년", " 15%"])
            for _ in range(120)
        )
    return texts


TEXTS = _texts()


@functools.cache
def llama2() -> Callable[[str], list[int]]:
    path = shipped_vocab("llama-spm")
    if path is None:
        message = f"{vocabs_dir()} has no ggml-vocab-llama-spm.gguf: run scripts/install-vocabs.sh"
        if os.environ.get("CI"):
            pytest.fail(message)  # on CI nothing may be skipped
        pytest.skip(message)
    return gguf_encoder(str(path))


@functools.cache
def bound() -> Callable[[str], int]:
    return Tokenizers().get(TokenizerSpec("bound", "open")).count


class TestTheOpenBoundOnJsonAndKorean:
    @pytest.mark.parametrize("kind", sorted(TEXTS))
    def test_never_under_llama_2(self, kind):
        text = TEXTS[kind]
        assert bound()(text) >= len(llama2()(text))

    @pytest.mark.parametrize("kind", sorted(TEXTS))
    def test_never_under_any_shipped_vocabulary(self, kind):
        text = TEXTS[kind]
        largest = max(len(load_vocabulary(name)(text)) for name in VOCABULARIES)
        assert bound()(text) >= largest

    def test_a_request_for_llama_2_counts_json_tool_results_above_the_real_count(self, counter_for):
        """The whole request, as a client sends Llama 2 a minified JSON tool result."""
        result = TEXTS["json_bools"] + TEXTS["json_camel_keys"]
        messages = [{"role": "user", "content": "Summarise:\n" + result}]
        ours = counter_for("meta-llama/Llama-2-7b-chat-hf").request({"model": "llama-2", "messages": messages})
        assert ours.total >= len(llama2()("[INST] Summarise:\n" + result + " [/INST]")) + 1  # and its BOS
