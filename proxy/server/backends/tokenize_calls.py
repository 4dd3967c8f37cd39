"""The tokenize calls of each kind of server that can count: the HTTP side of backend counting.

llama-server, llama-cpp-python and vLLM each answer the same two questions (tokens in a text;
prompt tokens of a chat rendered by its template) at different endpoints and in different
shapes. One class per kind speaks its dialect; `calls_for()` picks it for a discovered server.
What is asked, and when, is `proxy.server.backends.tokenize`'s job.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from proxy.server.backends.profiles import Discovery, answered_json, server_root, token_count


class TokenizeCalls(Protocol):
    """The two questions a backend can answer: tokens in a text (no special tokens added), and
    prompt tokens of a chat rendered by its template with the generation prompt."""

    async def text(self, text: str) -> int | None: ...

    async def conversation(self, messages: list[dict[str, Any]]) -> int | None: ...

    def use_headers(self, headers: Mapping[str, str]) -> None:
        """Send `headers` from now on (the upstream's credential, refreshed)."""


@dataclass
class _Http:
    session: aiohttp.ClientSession
    base_url: str
    model: str
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def root(self) -> str:
        return server_root(self.base_url)

    async def post(self, url: str, body: object) -> object:
        """`answered_json`: BackendDown when the server could not answer."""
        return await answered_json(self.session, "POST", url, body, self.headers)

    def use_headers(self, headers: Mapping[str, str]) -> None:
        if headers != self.headers:
            self.headers = dict(headers)


class LlamaServerCalls(_Http):
    """llama.cpp's llama-server: `POST /tokenize` and `POST /apply-template`."""

    async def text(self, text: str) -> int | None:
        return token_count(await self.post(f"{self.root}/tokenize", {"content": text, "add_special": False}))

    async def conversation(self, messages: list[dict[str, Any]]) -> int | None:
        rendered = await self.post(f"{self.root}/apply-template", {"messages": messages})
        prompt = rendered.get("prompt") if isinstance(rendered, dict) else None
        if not isinstance(prompt, str):
            return None
        return token_count(await self.post(f"{self.root}/tokenize", {"content": prompt, "add_special": True}))


class LlamaCppPythonCalls(_Http):
    """llama-cpp-python: `POST /extras/tokenize/count` (it parses special tokens, like its chat
    prompts, and adds BOS where the vocabulary asks for one); its template only by answering."""

    async def text(self, text: str) -> int | None:
        return token_count(await self.post(f"{self.root}/extras/tokenize/count", {"input": text, "model": self.model}))

    async def conversation(self, messages: list[dict[str, Any]]) -> int | None:
        body = {"model": self.model, "messages": messages, "max_tokens": 1, "temperature": 0}
        answer = await self.post(f"{self.base_url.rstrip('/')}/chat/completions", body)
        usage = answer.get("usage") if isinstance(answer, dict) else None
        prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else None


class VllmCalls(_Http):
    """vLLM: `POST /tokenize` with a `prompt`, or with `messages` (its chat template applied)."""

    async def text(self, text: str) -> int | None:
        body = {"model": self.model, "prompt": text, "add_special_tokens": False}
        return token_count(await self.post(f"{self.root}/tokenize", body))

    async def conversation(self, messages: list[dict[str, Any]]) -> int | None:
        body = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        return token_count(await self.post(f"{self.root}/tokenize", body))


def calls_for(
    discovery: Discovery,
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    headers: Mapping[str, str] | None = None,
) -> TokenizeCalls | None:
    """The tokenize calls of a discovered server, or None when it cannot tokenize."""
    kinds: dict[str | None, type[LlamaServerCalls | LlamaCppPythonCalls | VllmCalls]] = {
        "llama-server": LlamaServerCalls,
        "llama-cpp-python": LlamaCppPythonCalls,
        "vllm": VllmCalls,
    }
    calls = kinds.get(discovery.flavor)
    return calls(session, base_url, model, dict(headers or {})) if calls is not None else None
