"""Canonical path -> the adapter that speaks it.

The server normalises the request path once (`proxy.server.edge.paths`) and hands the canonical
string here. `endpoint_for()` answers with an `Endpoint`: the adapter, the model the path names
(an Azure deployment, a Vertex AI publisher model) and whether the proxy answers it itself
(`/v1/messages/count_tokens`). Paths not listed (`/v1/responses/{id}`, `/v1/models`, ...) get
None and go through the pass-through policy. Query strings (Azure's `api-version`) are not part
of the path and are forwarded as they came.

Where the path names the model (an Azure deployment, a Vertex AI model), that is the model the
provider serves: it is the request's model for budgets, routes and learned state, whatever the
body's `model` says (Azure ignores the body's; a body naming another model could otherwise make
one deployment's requests teach another's window). A model name, from the body or the path, is
refused past `proxy.apis.names.MAX_NAME_CHARS`.

    /v1/chat/completions, /chat/completions, /openai/v1/chat/completions      chat
    /openai/deployments/{deployment}/chat/completions                        chat (model = deployment)
    /v1/responses, /responses, /openai/v1/responses, /openai/responses        responses
    /v1/responses/compact, /responses/compact, /openai/v1/responses/compact   responses, a compaction request
    /v1/completions, /completions, /openai/v1/completions                    completions
    /openai/deployments/{deployment}/completions                             completions (model = deployment)
    /v1/messages, /messages                                                  messages
    /v1/messages/count_tokens, /messages/count_tokens                        messages, answered locally
    /v1/projects/{p}/locations/{l}/publishers/anthropic/models/{model}:rawPredict (and :streamRawPredict)
                                                                             messages (Vertex AI; model from the path)
    /v1/projects/{p}/locations/{l}/publishers/anthropic/models/count-tokens:rawPredict
                                                                             messages, answered locally
    /v1beta/models/{model}:generateContent (and /v1/..., :streamGenerateContent)
                                                                             generate_content (Gemini API)
    /v1/projects/{p}/locations/{l}/publishers/google/models/{model}:generateContent (and /v1beta1/...,
    :streamGenerateContent; express mode: /v1/publishers/google/models/...)  generate_content (Vertex AI)
    .../models/{model}:countTokens (either)                                  generate_content, answered locally
    /v1beta/interactions, /v1/interactions; Vertex AI's
    /v1beta1/projects/{p}/locations/{l}/interactions (and /v1/...)          interactions (model from the body)

A Gemini path's model is checked (`proxy.apis.gemini.generate_content.model_name`) before anything uses it, and
such a request goes to the upstream's host, under the path as the client wrote it
(`Endpoint.at_host_root`): Google's paths carry their own version and project.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy.apis.anthropic.messages import CountTokensAdapter, MessagesAdapter, count_tokens_body
from proxy.apis.base import Adapter, InvalidRequest, Parsed
from proxy.apis.bedrock import runtime as bedrock
from proxy.apis.bedrock.converse import ConverseAdapter
from proxy.apis.fields import unseen_parts
from proxy.apis.gemini.generate_content import CountTokensAdapter as GeminiCountAdapter
from proxy.apis.gemini.generate_content import GenerateContentAdapter, count_tokens_answer, model_name
from proxy.apis.gemini.interactions import InteractionsAdapter
from proxy.apis.known import NOTHING_KNOWN, KnownPrefix
from proxy.apis.names import bounded_name
from proxy.apis.openai.chat import ChatAdapter
from proxy.apis.openai.completions import CompletionsAdapter, CompletionsOptions
from proxy.apis.openai.responses import ResponsesAdapter, ResponsesCompactAdapter

API_NAMES = ("chat", "responses", "completions", "messages", "generate_content", "interactions")


@dataclass(frozen=True)
class Endpoint:
    adapter: Adapter
    path_model: str | None = None  # the model the path names: the one the provider serves
    local: bool = False  # answered by the proxy itself, never forwarded
    stream: bool = False  # the path itself asks for a stream (Vertex AI's streamRawPredict)
    answer: Callable[[int], Mapping[str, Any]] | None = None  # a local endpoint's answer for a count
    at_host_root: bool = False  # sent to the upstream's host under the path as written (Google's paths)
    # The path sent under the upstream's base URL, encoded, for the model a route sends (None: the
    # path's own): Bedrock's, whose model ids hold `:` and `/` (`proxy.apis.bedrock.runtime`).
    under_base: Callable[[str | None], str] | None = None

    @property
    def api(self) -> str:
        return self.adapter.name

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        """The adapter's parse, with the path's model in place of the body's; a request with no
        model at all, or one too long to key on, is refused. Parts the guard cannot see mark the
        request as not read whole (`known`: what the body shares with an earlier one)."""
        if self.at_host_root and self.path_model is not None:
            model_name(self.path_model)
        parsed = self.adapter.parse(body, known)
        if self.path_model is not None:
            bounded_name(self.path_model, "deployment")
            if parsed.model != self.path_model:
                parsed = replace(parsed, model=self.path_model)
        if parsed.model is None:
            raise InvalidRequest("'model' is required", param="model")
        bounded_name(parsed.model, "model")
        # The view's messages are the body's own (chat): those an earlier body's view held with
        # every part seen need no second look.
        unseen = unseen_parts(parsed.messages, known.seen_whole if parsed.message_hashes else 0)
        return replace(parsed, unseen=parsed.unseen + unseen) if unseen else parsed

    def upstream_segments(self, segments: tuple[str, ...], served: str | None) -> tuple[str, ...]:
        """A Google path's segments as sent upstream: the last one names the model that serves
        the request (after a route's rename, its last component), checked again."""
        if not self.at_host_root or self.path_model is None or not segments or served in (None, self.path_model):
            return segments
        method = segments[-1].rpartition(":")[2]
        return (*segments[:-1], f"{model_name(served.rpartition('/')[2])}:{method}")


def endpoint_api(endpoint: Endpoint) -> str:
    """The API shape an endpoint speaks, as routes and logs name it (`count_tokens` for Anthropic's
    answered locally, `generate_content.count_tokens` for Gemini's)."""
    if endpoint.local and endpoint.api.startswith("messages"):
        return "count_tokens"
    return endpoint.api


class AdapterRegistry:
    """Endpoints by canonical path, built once (with the completions settings). The bodies they
    receive are read by `proxy.wire.readers.BodyReaders`, one reader per adapter."""

    def __init__(self, completions: CompletionsOptions | None = None) -> None:
        self.chat = ChatAdapter()
        self.responses = ResponsesAdapter()
        self.completions = CompletionsAdapter(completions)
        self.messages = MessagesAdapter()
        self.count_tokens = CountTokensAdapter()
        self.gemini = GenerateContentAdapter()
        self.gemini_count = GeminiCountAdapter()
        self.interactions = InteractionsAdapter()
        self.converse, self.invoke, self.bedrock_count = (  # bedrock-runtime's
            ConverseAdapter(), bedrock.InvokeAdapter(), bedrock.CountTokensAdapter()
        )
        chat, responses, completions_ = Endpoint(self.chat), Endpoint(self.responses), Endpoint(self.completions)
        messages, compact = Endpoint(self.messages), Endpoint(ResponsesCompactAdapter())
        counting = Endpoint(self.count_tokens, local=True, answer=count_tokens_body)
        self.exact: Mapping[str, Endpoint] = {
            "/v1/chat/completions": chat,
            "/chat/completions": chat,
            "/openai/v1/chat/completions": chat,
            "/v1/responses": responses,
            "/responses": responses,
            "/openai/v1/responses": responses,
            "/openai/responses": responses,
            **dict.fromkeys(("/v1/responses/compact", "/responses/compact", "/openai/v1/responses/compact"), compact),
            "/v1/completions": completions_,
            "/completions": completions_,
            "/openai/v1/completions": completions_,
            "/v1/messages": messages,
            "/messages": messages,
            "/v1/messages/count_tokens": counting,
            "/messages/count_tokens": counting,
            **self._interactions_paths(),
        }

    @property
    def adapters(self) -> tuple[Adapter, ...]:
        """Every adapter, once (the body readers of `proxy.wire.readers` keep one reader each)."""
        return (self.chat, self.responses, self.completions, self.messages, self.count_tokens, self.gemini,
                self.gemini_count, self.interactions, self.converse, self.invoke, self.bedrock_count)  # fmt: skip

    def _interactions_paths(self) -> dict[str, Endpoint]:
        """Google's Interactions API on the Developer API's versions (google-genai sends `/v1`):
        sent to the upstream's host under the path as written."""
        interactions = Endpoint(self.interactions, at_host_root=True)
        return {f"/{version}/interactions": interactions for version in ("v1", "v1beta", "v1alpha")}

    def endpoint_for(self, path: str) -> Endpoint | None:
        """The endpoint for a canonical path, or None for a path no adapter counts."""
        endpoint = self.exact.get(path)
        if endpoint is not None:
            return endpoint
        match = _AZURE.fullmatch(path)
        if match:
            adapter: Adapter = self.chat if match["kind"] == "chat/completions" else self.completions
            return Endpoint(adapter, path_model=match["deployment"])
        match = _GEMINI.fullmatch(path)
        if match:
            return self._gemini(match["model"] or match["vmodel"], match["method"] or match["vmethod"])
        if _VERTEX_INTERACTIONS.fullmatch(path):
            return Endpoint(self.interactions, at_host_root=True)
        match = _VERTEX_CLAUDE.fullmatch(path)
        if match and match["model"] == "count-tokens":
            return Endpoint(self.count_tokens, local=True, answer=count_tokens_body)
        if match:
            return Endpoint(self.messages, path_model=match["model"], stream=match["method"] == "streamRawPredict")
        match = bedrock.BEDROCK_PATH.fullmatch(path)
        return self._bedrock(bedrock.model_id(match["model"]), match["operation"]) if match else None

    def _bedrock(self, model: str, operation: str) -> Endpoint:
        """bedrock-runtime's: routed and counted by the model the id names, sent under the id as written."""
        named = bedrock.routed_model(model)
        if operation == "count-tokens":
            return Endpoint(self.bedrock_count, named, local=True, answer=bedrock.count_tokens_answer)
        adapter: Adapter = self.converse if operation.startswith("converse") else self.invoke
        path = functools.partial(bedrock.upstream_path, model, operation)
        return Endpoint(adapter, named, stream=operation in bedrock.STREAMING, under_base=path)

    def _gemini(self, model: str, method: str) -> Endpoint:
        if method == "countTokens":
            return Endpoint(self.gemini_count, model, local=True, answer=count_tokens_answer, at_host_root=True)
        return Endpoint(self.gemini, model, stream=method == "streamGenerateContent", at_host_root=True)

    def api_for(self, path: str) -> str | None:
        """The API shape a canonical path speaks (`count_tokens` for the one answered locally), or None."""
        endpoint = self.endpoint_for(path)
        return None if endpoint is None else endpoint_api(endpoint)

    def by_name(self, api: str) -> Adapter:
        """The adapter for an API name (the CLI's `--api`)."""
        adapters: dict[str, Adapter] = {
            "chat": self.chat,
            "responses": self.responses,
            "completions": self.completions,
            "messages": self.messages,
            "generate_content": self.gemini,
            "interactions": self.interactions,
        }
        if api not in adapters:
            raise ValueError(f"unknown API {api!r}; known: {', '.join(API_NAMES)}")
        return adapters[api]

    def detect(self, body: object) -> Adapter:
        """The adapter a body most likely belongs to, from its fields (for the CLI when `--api`
        is not given): `input`/`instructions` -> responses, `prompt` -> completions, top-level
        `system` or `max_tokens` with Anthropic blocks -> messages, else chat."""
        if not isinstance(body, Mapping):
            return self.chat
        if "contents" in body:
            return self.gemini
        if "input" in body or "instructions" in body:
            return self.responses
        if "prompt" in body and "messages" not in body:
            return self.completions
        if "system" in body or "anthropic_version" in body or _has_anthropic_blocks(body.get("messages")):
            return self.messages
        return self.chat


_SEGMENT = r"[^/]+"
_AZURE = re.compile(rf"/openai/deployments/(?P<deployment>{_SEGMENT})/(?P<kind>chat/completions|completions)")
_VERTEX_CLAUDE = re.compile(
    rf"/v1/projects/{_SEGMENT}/locations/{_SEGMENT}/publishers/anthropic/models/"
    r"(?P<model>[^/:]+):(?P<method>rawPredict|streamRawPredict)"
)
# Gemini: the Developer API (`v1`, `v1beta`) and Vertex AI's publisher models (`v1`, `v1beta1`; regional
# and global locations, and express mode's paths without a project).
# The model is any segment here, checked when the request is parsed: a loose match, so that no
# spelling of these paths falls through to pass-through uncounted.
_GEMINI = re.compile(
    rf"/(?:v1|v1beta|v1alpha)/models/(?P<model>[^/:]+):(?P<method>generateContent|streamGenerateContent|countTokens)"
    rf"|/(?:v1|v1beta1)/(?:projects/{_SEGMENT}/locations/{_SEGMENT}/)?publishers/google/models/(?P<vmodel>[^/:]+)"
    r":(?P<vmethod>generateContent|streamGenerateContent|countTokens)"
)
# Vertex AI's Interactions API: a project's and location's (google-genai with vertexai=True sends v1beta1).
_VERTEX_INTERACTIONS = re.compile(rf"/(?:v1|v1beta1)/projects/{_SEGMENT}/locations/{_SEGMENT}/interactions")
_ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result", "thinking", "redacted_thinking", "document"})


def _has_anthropic_blocks(messages: object) -> bool:
    if not isinstance(messages, list):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and any(
            isinstance(b, Mapping) and str(b.get("type")) in _ANTHROPIC_BLOCKS | {"image"} for b in content
        ):
            return True
    return False
