"""Every API shape the guard counts, one line each (`SHAPES`), and canonical path -> the adapter
that speaks it.

Each shape's own module says what it is (`shape(options) -> Shape`, `proxy.apis.endpoints`): its
adapters, its fixed paths and the paths it knows by a pattern. A new shape is its module (or
folder) and one line in `SHAPES`.

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
refused past `proxy.apis.endpoints.MAX_NAME_CHARS`.

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
    /model/{modelId}/converse (and /converse-stream)                         converse (AWS Bedrock; model from the path)
    /model/{modelId}/invoke (and /invoke-with-response-stream)               invoke (Claude's Messages body on Bedrock)
    /model/{modelId}/count-tokens                                            converse or invoke, answered locally

A Gemini path's model is checked (`Endpoint.model_check`: `proxy.apis.gemini.generate_content.model_name`)
before anything uses it, and such a request goes to the upstream's host, under the path as the
client wrote it (`Endpoint.at_host_root`): Google's paths carry their own version and project.
A Bedrock path is read by its shape (`Shape.reads_path`): a model id holds `:` and, as an ARN, an
encoded `/` in its one segment (`proxy.apis.bedrock.runtime`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from proxy.apis.anthropic import messages
from proxy.apis.base import Adapter
from proxy.apis.bedrock import runtime
from proxy.apis.endpoints import Endpoint as Endpoint
from proxy.apis.endpoints import Shape, ShapeOptions
from proxy.apis.endpoints import endpoint_api as endpoint_api
from proxy.apis.gemini import generate_content, interactions
from proxy.apis.openai import chat, completions, responses

# Every shape, one line each: its module's `shape(options)`, in the order its patterns are tried.
SHAPES: tuple[Callable[[ShapeOptions], Shape], ...] = (
    chat.shape,
    responses.shape,
    completions.shape,
    messages.shape,
    generate_content.shape,
    interactions.shape,
    runtime.converse_shape,
    runtime.invoke_shape,
)
_DEFAULT_SHAPES = tuple(make({}) for make in SHAPES)  # each shape built once, with no settings
API_NAMES: tuple[str, ...] = tuple(shape.name for shape in _DEFAULT_SHAPES)
_PATH_READERS = tuple(dict.fromkeys(r for shape in _DEFAULT_SHAPES if (r := shape.reads_path) is not None))


def shape_path(raw: str) -> str | None:
    """The canonical spelling a shape gives a raw path of its own (`Shape.reads_path`), or None
    when no shape reads it so; ValueError when the shape refuses it."""
    for read in _PATH_READERS:
        found = read(raw)
        if found is not None:
            return found
    return None


class AdapterRegistry:
    """Endpoints by canonical path, built once from every shape (with the shapes' settings, by API
    name: `apis.completions`). The bodies they receive are read by `proxy.wire.readers.BodyReaders`,
    one reader per adapter."""

    def __init__(self, completions: object | None = None, options: ShapeOptions | None = None) -> None:
        settings = {**(options or {}), **({"completions": completions} if completions is not None else {})}
        self.shapes = tuple(make(settings) for make in SHAPES)
        self._named = {shape.name: shape.adapter for shape in self.shapes}
        exact: dict[str, Endpoint] = {}
        for shape in self.shapes:
            exact.update(shape.exact)
        self.exact: Mapping[str, Endpoint] = exact

    @property
    def adapters(self) -> tuple[Adapter, ...]:
        """Every adapter, once (the body readers of `proxy.wire.readers` keep one reader each)."""
        return tuple(adapter for shape in self.shapes for adapter in shape.adapters)

    def endpoint_for(self, path: str) -> Endpoint | None:
        """The endpoint for a canonical path, or None for a path no adapter counts."""
        endpoint = self.exact.get(path)
        if endpoint is not None:
            return endpoint
        for shape in self.shapes:
            endpoint = shape.match(path)
            if endpoint is not None:
                return endpoint
        return None

    def api_for(self, path: str) -> str | None:
        """The API shape a canonical path speaks (`count_tokens` for the one answered locally), or None."""
        endpoint = self.endpoint_for(path)
        return None if endpoint is None else endpoint_api(endpoint)

    def generates(self, segments: tuple[str, ...]) -> bool:
        """Whether an upstream receiving the path `segments` would generate (some shape's endpoint)."""
        return any(shape.generates(segments) for shape in self.shapes)

    def by_name(self, api: str) -> Adapter:
        """The adapter for an API name (the CLI's `--api`)."""
        if api not in self._named:
            raise ValueError(f"unknown API {api!r}; known: {', '.join(API_NAMES)}")
        return self._named[api]

    def detect(self, body: object) -> Adapter:
        """The adapter a body most likely belongs to, from its fields (for the CLI when `--api`
        is not given): `input`/`instructions` -> responses, `prompt` -> completions, top-level
        `system` or `max_tokens` with Anthropic blocks -> messages, else chat."""
        name = "chat"
        if not isinstance(body, Mapping):
            pass
        elif "contents" in body:
            name = "generate_content"
        elif "input" in body or "instructions" in body:
            name = "responses"
        elif "prompt" in body and "messages" not in body:
            name = "completions"
        elif "system" in body or "anthropic_version" in body or _has_anthropic_blocks(body.get("messages")):
            name = "messages"
        return self.by_name(name)


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
