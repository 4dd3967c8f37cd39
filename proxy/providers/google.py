"""Google's two APIs: Vertex AI and the Gemini Developer API.

Both take an API key in `x-goog-api-key`, keep the operator's credential in the project its base
URL names (`proxy.server.edge.credentials.outside_project`), serve Google's native paths from the
host's root, count at `countTokens` and say a cache's size at `GET {version}/cachedContents/{id}`.

- Vertex AI: its OpenAI-compatible endpoint (chat) and its native `publishers/google` paths.
  `POST .../publishers/google/models/{model}:countTokens` with `contents`, `systemInstruction` and
  `tools`, answered `{"totalTokens": N}`; a chat body is said as those (`vertex_body`). In express
  mode (an API key, the global host, no project: a base URL without `/projects/`) the same call is
  `POST /v1/publishers/google/models/{model}:countTokens` at the base's host (`/v1beta1/...` when
  the base says `v1beta1`; Google's "Vertex AI in express mode REST API reference").
- Gemini Developer API: `POST /v1beta/models/{model}:countTokens` with the whole request as its
  `generateContentRequest`, answered `{"totalTokens": N}`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import quote

from proxy.core.counting.edge import CountCall, vertex_body
from proxy.core.models.model_names import url_model_name
from proxy.core.models.model_registry import TokenizerSpec
from proxy.providers.anthropic import CLAUDE_BOUND
from proxy.providers.provider import BackendProfile, Provider

# What countTokens reads of a generateContent request (Vertex AI takes them at the top level).
_GEMINI_FIELDS = ("contents", "systemInstruction", "system_instruction", "tools", "toolConfig", "tool_config")
_VERTEX_BASE = re.compile(r"^(https?://[^/]+/v1(?:beta1)?/projects/[^/]+/locations/[^/]+)(?:/|$)")
_HOST_AND_PATH = re.compile(r"^(https?://[^/?#]+)([^?#]*)")
# A cache's name as Google's two APIs write it: `cachedContents/{id}` (Gemini), or under a project.
_CACHE_NAME = re.compile(r"^(?:projects/[\w.-]+/locations/[\w-]+/)?cachedContents/[\w-]{1,128}$")
_VERSION = re.compile(r"^https?://[^/]+/(v1beta1|v1beta|v1)(?:/|$)")  # the version the base URL's path opens with


class Google(Provider):
    """What Vertex AI and the Gemini API share."""

    backend_kind: ClassVar[str] = "vertex"  # Gemini's Developer API words its limits as Vertex AI does
    key_header: ClassVar[str | None] = "x-goog-api-key"
    google_native: ClassVar[bool] = True
    count_endpoint: ClassVar[bool] = True
    # Gemini is counted with Gemma's vocabularies (the same tokenizer); Claude is served on Vertex AI too.
    vocabularies_at_start: ClassVar[tuple[TokenizerSpec, ...]] = (
        *(TokenizerSpec("vocab", name) for name in ("gemma", "gemma3", "gemma4")),
        CLAUDE_BOUND,
    )
    default_version: ClassVar[str] = "v1"  # a cache's version when the base URL's path names none

    def held_size_path(self, base_url: str, kind: str, held_id: str) -> tuple[str, ...] | None:
        if kind != "cache" or _CACHE_NAME.match(held_id) is None:
            return None
        stated = _VERSION.match(base_url)
        return (stated.group(1) if stated else self.default_version, *held_id.split("/"))

    def _native_call(self, base: str, model: str, body: Mapping[str, Any]) -> CountCall | None:
        """The countTokens call for a native Gemini request (`_counted_at`); None for a model that
        is not one plain path segment (never asked about)."""
        name = url_model_name(model.rpartition("/")[2])
        if name is None:
            return None
        picked = {k: body[k] for k in _GEMINI_FIELDS if k in body}
        return self._counted_at(base, name, picked)

    def _counted_at(self, base: str, name: str, picked: Mapping[str, Any]) -> CountCall | None:
        raise NotImplementedError


class Vertex(Google):
    kind: ClassVar[str] = "vertex"
    backend: ClassVar[BackendProfile | None] = BackendProfile(
        "vertex", True, True, ("input token count", "exceeds the maximum number of tokens allowed")
    )
    shapes: ClassVar[tuple[str, ...]] = ("chat", "generate_content", "interactions")

    def count_call(self, base_url: str, model: str, api: str, body: Mapping[str, Any]) -> CountCall | None:
        base = base_url.rstrip("/")
        if api == "generate_content":
            return self._native_call(base, model, body)
        if api != "chat":
            return None
        # The OpenAI-compatible endpoint: a project's only.
        found, contents = _VERTEX_BASE.match(base), vertex_body(body)
        if found is None or contents is None:
            return None
        # The model is written into the URL: a name that is not one plain path segment is never asked about.
        name = url_model_name(model.split("/", 1)[1] if model.startswith("google/") else model)
        if name is None:
            return None
        return CountCall(f"{found.group(1)}/publishers/google/models/{name}:countTokens", contents, "totalTokens")

    def _counted_at(self, base: str, name: str, picked: Mapping[str, Any]) -> CountCall | None:
        models = _vertex_models(base)
        if models is None:
            return None
        return CountCall(f"{models}/{quote(name, safe='')}:countTokens", picked, "totalTokens")

    def native_path(self, asks_google: bool) -> bool:
        return asks_google  # an OpenAI-shaped path goes to the OpenAI-compatible endpoint under the base URL

    def google_preference(self, names_project: bool) -> int | None:
        return 0 if names_project else 1


class Gemini(Google):
    """The Gemini Developer API, its base URL at the host's root."""

    kind: ClassVar[str] = "gemini"
    shapes: ClassVar[tuple[str, ...]] = ("generate_content", "interactions")
    default_version: ClassVar[str] = "v1beta"

    def count_call(self, base_url: str, model: str, api: str, body: Mapping[str, Any]) -> CountCall | None:
        return self._native_call(base_url.rstrip("/"), model, body) if api == "generate_content" else None

    def _counted_at(self, base: str, name: str, picked: Mapping[str, Any]) -> CountCall | None:
        root = re.sub(r"^(https?://[^/]+).*$", r"\1", base)
        request = {"generateContentRequest": {**picked, "model": f"models/{name}"}}
        return CountCall(f"{root}/v1beta/models/{quote(name, safe='')}:countTokens", request, "totalTokens")

    def native_path(self, asks_google: bool) -> bool:
        return True

    def google_preference(self, names_project: bool) -> int | None:
        return 1 if names_project else 0


def _vertex_models(base: str) -> str | None:
    """Where Vertex AI's publisher models are for an upstream at `base`: under the base's project
    and location, or in express mode (no project in the base) under the host's `/v1` (`/v1beta1`
    when the base's path starts with it); None for a base that is neither."""
    found = _VERTEX_BASE.match(base)
    if found is not None:
        return f"{found.group(1)}/publishers/google/models"
    split = _HOST_AND_PATH.match(base)
    if split is None or "/projects/" in f"{split.group(2)}/":
        return None
    version = "v1beta1" if re.match(r"/v1beta1(?:/|$)", split.group(2)) else "v1"
    return f"{split.group(1)}/{version}/publishers/google/models"
