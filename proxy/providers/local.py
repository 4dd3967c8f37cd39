"""Servers the operator runs (vLLM, llama.cpp, Ollama, or one to be asked: `auto`), any other
OpenAI-compatible server (`generic`), and the built-in echo upstream.

The self-hosted ones are asked at start what they are (`proxy.server.backends.profiles.discover`:
their window, whether they tokenize); they count through their tokenize endpoints, not a count
endpoint of their own (`proxy.server.backends.tokenize`)."""

from __future__ import annotations

from typing import ClassVar

from proxy.providers.openai import OPENAI_SHAPES
from proxy.providers.provider import BackendProfile, Provider

EVERY_SHAPE = ("chat", "responses", "completions", "messages", "generate_content", "interactions")


class Discovered(Provider):
    """A server asked at start what it is."""

    discovered: ClassVar[bool] = True


class Auto(Discovered):
    """Whatever answers: vLLM, llama.cpp or Ollama, told apart by the endpoints it answers."""

    kind: ClassVar[str] = "auto"
    shapes: ClassVar[tuple[str, ...]] = ("chat", "responses", "completions", "messages")
    backend_kind: ClassVar[str] = "auto"


class VLLM(Discovered):
    kind: ClassVar[str] = "vllm"
    shapes: ClassVar[tuple[str, ...]] = OPENAI_SHAPES
    backend_kind: ClassVar[str] = "vllm"
    backend: ClassVar[BackendProfile | None] = BackendProfile(
        "vllm", True, True, ("maximum context length is", "your request has", "in the messages")
    )


class LlamaCpp(Discovered):
    kind: ClassVar[str] = "llamacpp"
    shapes: ClassVar[tuple[str, ...]] = ("chat", "completions")
    backend_kind: ClassVar[str] = "llamacpp"
    # llama-server says `exceed_context_size_error`; llama-cpp-python, OpenAI's words (non-streaming
    # only: a stream is answered 200 with an empty body).
    backend: ClassVar[BackendProfile | None] = BackendProfile(
        "llamacpp",
        False,
        True,
        ("exceed_context_size_error", "exceeds the available context size", "maximum context length is"),
        empty_stream_on_overflow=True,
        request_id_must_be_uuid=True,  # llama-cpp-python's starlette-context RequestIdPlugin
    )


class Ollama(Discovered):
    """Ollama: it states a model's window only when asked about that model, and silently cuts a
    prompt longer than it (it never says the prompt overflowed)."""

    kind: ClassVar[str] = "ollama"
    shapes: ClassVar[tuple[str, ...]] = ("chat", "completions")
    backend_kind: ClassVar[str] = "ollama"
    backend: ClassVar[BackendProfile | None] = BackendProfile(
        "ollama", False, True, (), signals_overflow=False, window_per_model=True
    )


class Generic(Provider):
    """Any server speaking the shapes it is routed: asked nothing, counted locally."""

    kind: ClassVar[str] = "generic"
    shapes: ClassVar[tuple[str, ...]] = EVERY_SHAPE
    backend: ClassVar[BackendProfile | None] = BackendProfile(
        "generic", True, False, ("maximum context length", "context length", "too long"), named_in_corrections=False
    )


class Echo(Provider):
    """The built-in echo upstream (`proxy.demo.echo`): every shape, answered with what reached it."""

    kind: ClassVar[str] = "echo"
    shapes: ClassVar[tuple[str, ...]] = (*EVERY_SHAPE, "converse", "invoke")  # bedrock-runtime's too
    backend_kind: ClassVar[str] = "openai"

    def describe(self, name: str, base_url: str) -> str:
        return "the built-in echo upstream (no model is called)"
