"""Every upstream kind the settings accept, one line each, and the one lookup of a kind's provider.

A new provider is a module (or folder) in `proxy.providers` and one line here."""

from __future__ import annotations

from collections.abc import Mapping

from proxy.providers.anthropic import Anthropic
from proxy.providers.bedrock import Bedrock
from proxy.providers.google import Gemini, Vertex
from proxy.providers.local import VLLM, Auto, Echo, Generic, LlamaCpp, Ollama
from proxy.providers.openai import Azure, OpenAI
from proxy.providers.provider import Provider

PROVIDERS: Mapping[str, Provider] = {
    provider.kind: provider
    for provider in (
        Auto(),
        OpenAI(),
        Azure(),
        Vertex(),
        Gemini(),
        VLLM(),
        LlamaCpp(),
        Ollama(),
        Anthropic(),
        Bedrock(),
        Generic(),
        Echo(),
    )
}
KINDS: tuple[str, ...] = tuple(PROVIDERS)


def provider_for(kind: str) -> Provider:
    """The provider of upstream kind `kind`; ValueError naming the known kinds for any other."""
    try:
        return PROVIDERS[kind]
    except KeyError:
        raise ValueError(f"must be one of {', '.join(KINDS)}, not {kind!r}") from None
