"""An exception from a native library never escapes as a closed connection.

A tokenizer can raise a `BaseException` that is not an `Exception` (tiktoken's Rust panic,
pyo3's `PanicException`). Here a tokenizer whose count raises a `BaseException` subclass stands in
for the panic, on every path a count takes (on the loop, in the medium-body threads, in the
large-body threads) and for each API shape: each is answered with a JSON error in the API's shape,
and the log gets JSON lines only.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import pytest

from proxy.logging import configure_logging
from proxy.server.backends.models import Models
from tests.adversarial.conftest import anthropic_body_of, body_of, post

TRIGGER = "\t" * 64


class PanicException(BaseException):  # pyo3's name
    """What pyo3 raises when Rust code panics: not an `Exception`."""


@dataclass
class PanickingTokenizer:
    """A real tokenizer that panics on texts holding `TRIGGER`, as tiktoken did on long runs of whitespace."""

    base: object

    @property
    def name(self) -> str:
        return self.base.name  # type: ignore[attr-defined,no-any-return]

    @property
    def identity(self) -> str:
        return self.base.identity  # type: ignore[attr-defined,no-any-return]

    @property
    def exact(self) -> bool:
        return True

    def count(self, text: str) -> int:
        if TRIGGER in text:
            raise PanicException("called `Result::unwrap()` on an `Err` value")
        return self.base.count(text)  # type: ignore[attr-defined,no-any-return]

    def count_many(self, texts: list[str]) -> list[int]:
        return [self.count(t) for t in texts]


@pytest.fixture
def log_lines():
    stream = io.StringIO()
    configure_logging("json", "info", stream=stream)
    return stream


def panicking_guard(model_map):
    def make(settings):
        guard = Models(settings, model_map)
        spec = guard.profile("gpt-4o").tokenizer
        guard.tokenizers._loaded[spec] = PanickingTokenizer(guard.tokenizers.get(spec))  # type: ignore[assignment]
        return guard

    return make


ANTHROPIC = {"upstreams": {"fake": {"kind": "anthropic"}}}


@pytest.mark.parametrize("size", [100, 50_000, 400_000], ids=["on-the-loop", "medium-thread", "large-thread"])
async def test_a_tokenizer_panic_is_a_clean_openai_error_and_one_json_log_line(
    serve_guard, settings, model_map, log_lines, capsys, size
):
    guard = await serve_guard(settings(), guard=panicking_guard(model_map))
    status, answer, _ = await post(guard.url("/v1/chat/completions"), body_of("x " * (size // 2) + TRIGGER))
    assert status == 500
    error = json.loads(answer)["error"]
    assert error["type"] == "server_error" and "request id" in error["message"]
    lines = [json.loads(line) for line in log_lines.getvalue().splitlines() if line.strip()]  # every line JSON
    unhandled = [line for line in lines if line["event"] == "unhandled_error"]
    assert len(unhandled) == 1 and unhandled[0]["error_type"] == "PanicException"
    assert [line["status"] for line in lines if line["event"] == "request"] == [500]
    assert capsys.readouterr().out == ""


async def test_a_tokenizer_panic_on_count_tokens_is_an_error_in_anthropics_shape(
    serve_guard, settings, model_map, log_lines
):
    guard = await serve_guard(settings(), guard=panicking_guard(model_map))
    body = anthropic_body_of("a few words " + TRIGGER, model="gpt-4o")
    status, answer, _ = await post(guard.url("/v1/messages/count_tokens"), body)
    assert status == 500
    data = json.loads(answer)
    assert data["type"] == "error" and data["error"]["type"] == "api_error"


async def test_the_guard_answers_the_next_request_after_a_panic(serve_guard, settings, model_map, log_lines):
    guard = await serve_guard(settings(), guard=panicking_guard(model_map))
    chat = guard.url("/v1/chat/completions")
    assert (await post(chat, body_of("x " * 200_000 + TRIGGER)))[0] == 500
    status, answer, _ = await post(chat, body_of("hello"))
    assert status == 200 and json.loads(answer)["object"] == "chat.completion"
