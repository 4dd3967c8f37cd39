"""What a path names, and how an API shape registers its paths.

An `Endpoint` is what the registry (`proxy.apis.registry`) answers for a canonical path: the
adapter that reads it, the model the path names (an Azure deployment, a Vertex AI publisher
model), whether the proxy answers it itself (a count endpoint) and how it is sent upstream. A
`Shape` is one API shape as its own module registers it: its name, its adapters, its fixed paths
and the paths it recognises by pattern (those that carry a model or a project).

Where the path names the model, that is the model the provider serves: it is the request's model
for budgets, routes and learned state, whatever the body's `model` says (Azure ignores the body's;
a body naming another model could otherwise make one deployment's requests teach another's
window). A model name, from the body or the path, is refused past `MAX_NAME_CHARS`: it picks a
profile, a route, a mode, the key learned state is kept under, a metrics label and a row of the
recent-decisions page, and no provider's model names come near it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.apis.base import Adapter, InvalidRequest, Parsed
from proxy.apis.fields import NOTHING_KNOWN, KnownPrefix, unseen_parts

MAX_NAME_CHARS = 256


def bounded_name(name: str, param: str) -> str:
    """`name` when it is at most `MAX_NAME_CHARS` characters; else InvalidRequest naming `param`."""
    if len(name) > MAX_NAME_CHARS:
        raise InvalidRequest(f"'{param}' must be at most {MAX_NAME_CHARS} characters, not {len(name):,}", param=param)
    return name


@dataclass(frozen=True)
class Endpoint:
    adapter: Adapter
    path_model: str | None = None  # the model the path names: the one the provider serves
    local: bool = False  # answered by the proxy itself, never forwarded
    stream: bool = False  # the path itself asks for a stream (Vertex AI's streamRawPredict)
    answer: Callable[[int], Mapping[str, Any]] | None = None  # a local endpoint's answer for a count
    at_host_root: bool = False  # sent to the upstream's host under the path as written (Google's paths)
    # The shape's check of a model written into an upstream path (Gemini's: one plain segment).
    model_check: Callable[[str], str] | None = None
    named: str | None = None  # the API name routes and logs use, when not the adapter's
    # The path sent under the upstream's base URL, encoded, for the model the route sends (None: the
    # canonical path): a shape whose model ids hold `:` and an encoded `/` in one segment (Bedrock's).
    sent_path: Callable[[str | None], str] | None = None

    @property
    def api(self) -> str:
        return self.adapter.name

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        """The adapter's parse, with the path's model in place of the body's; a request with no
        model at all, or one too long to key on, is refused. Parts the guard cannot see mark the
        request as not read whole (`known`: what the body shares with an earlier one)."""
        if self.model_check is not None and self.path_model is not None:
            self.model_check(self.path_model)
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
        """A host-root path's segments as sent upstream: the last one names the model that serves
        the request (after a route's rename, its last component), checked again."""
        check = self.model_check
        if check is None or self.path_model is None or not segments or served in (None, self.path_model):
            return segments
        method = segments[-1].rpartition(":")[2]
        return (*segments[:-1], f"{check(served.rpartition('/')[2])}:{method}")


def endpoint_api(endpoint: Endpoint) -> str:
    """The API shape an endpoint speaks, as routes and logs name it (`count_tokens` for Anthropic's
    answered locally, `generate_content.count_tokens` for Gemini's)."""
    return endpoint.named or endpoint.api


def _no_pattern(path: str) -> Endpoint | None:
    return None


def _generates_nothing(segments: tuple[str, ...]) -> bool:
    return False


@dataclass(frozen=True)
class Shape:
    """One API shape as the registry serves it, made by the shape's own module (`shape(options)`)."""

    name: str  # its API name: routes, logs, metrics, the `apis:` setting of an upstream, the CLI's `--api`
    adapters: tuple[Adapter, ...]  # every adapter its bodies are read with, the one named `name` first
    exact: Mapping[str, Endpoint] = field(default_factory=dict)  # its fixed canonical paths
    match: Callable[[str], Endpoint | None] = _no_pattern  # the paths it knows by a pattern (a model, a project)
    # Whether a path an upstream would receive (its segments) reaches one of the shape's generating
    # endpoints, spelled in any way a server accepts: pass-through never sends one there uncounted.
    generates: Callable[[tuple[str, ...]], bool] = _generates_nothing
    # The canonical spelling of a raw path (still percent-encoded) of the shape's own that the
    # general reading refuses (Bedrock's model ids: an ARN's encoded `/` inside one segment); None
    # for any other path, ValueError to refuse it (`proxy.server.edge.paths.canonical_path`).
    reads_path: Callable[[str], str | None] | None = None

    @property
    def adapter(self) -> Adapter:
        return self.adapters[0]


# The settings of the shapes that have some (`apis.<name>` in the config), by API name.
ShapeOptions = Mapping[str, Any]
