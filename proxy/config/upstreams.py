"""The `upstreams` and `routes` sections of the settings: where requests go, how each upstream
authenticates and counts, and which model goes where (`proxy.config.settings` reads the whole file)."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Annotated, ClassVar, Literal

from proxy.apis.registry import API_NAMES
from proxy.config.backends import BackendOptions
from proxy.config.schema import INTERNAL, Bounds, PositiveFloat, SchemaError, carried
from proxy.providers.kinds import provider_for
from proxy.providers.provider import Provider, SettingsRefused


@dataclass(frozen=True, kw_only=True)
class UpstreamSettings:
    name: str = field(default="", metadata=INTERNAL)  # filled from the key under `upstreams`
    base_url: str
    # Which API shapes it serves, how it authenticates, and how it counts: `auto` asks the server at
    # start (vLLM, llama.cpp, Ollama: its window, its tokenizer; `--upstream URL` is `auto`);
    # `generic` asks nothing.
    kind: str = "generic"  # one of `proxy.providers.kinds.KINDS`
    tokenize: Literal["auto", "local", "backend"] = "auto"  # count with the server's own tokenizer where it has one
    discovery_timeout: Annotated[float, Bounds(gt=0, le=60)] = 3.0
    tokenize_timeout: Annotated[float, Bounds(gt=0, le=60)] = 2.0  # one request's tokenize calls together
    framing_timeout: Annotated[float, Bounds(gt=0, le=300)] = 30.0  # measuring the chat template, once per model
    tokenize_concurrency: Annotated[int, Bounds(ge=1, le=64)] = 4
    # Near the budget's edge (an estimate's bounds straddle it), ask the upstream's own count
    # endpoint once (proxy.server.backends.provider_count), within `provider_count_timeout` seconds; for
    # tokenizers that state no worst case, `provider_count_ratio` is assumed (real >= count / ratio).
    provider_count: bool = True
    provider_count_timeout: Annotated[float, Bounds(gt=0, le=30)] = 2.0
    provider_count_ratio: Annotated[float, Bounds(ge=1, le=10)] | None = None
    # Where the server lowers max_tokens to what the window leaves (llama.cpp, Ollama): the output
    # the budget keeps free at least; null: the default reserve (15% of the window, 500 to 4,096).
    min_output_tokens: Annotated[int, Bounds(ge=0)] | None = None
    apis: tuple[str, ...] | None = None  # the API shapes it serves (`API_NAMES`); None: what its kind serves
    api_key_env: str | None = None  # injected as the kind's auth header; else the client's passes through
    token_command: str | None = None  # e.g. `gcloud auth print-access-token`
    token_file: str | None = None
    token_refresh_seconds: Annotated[float, Bounds(ge=1)] = 3000.0
    # `adc`: a token from Google's Application Default Credentials (a service-account file, the
    # metadata server on GKE and Cloud Run, gcloud's user credentials), refreshed before it expires.
    # `sigv4` (a provider that signs: `kind: bedrock`): every request signed again with the AWS
    # credentials of the guard's environment (botocore's chain: environment keys, profiles,
    # container and instance roles) for `region` (`proxy.providers.bedrock_sigv4`).
    auth: Literal["adc", "sigv4"] | None = None
    region: str | None = None  # the AWS region a `kind: bedrock` upstream signs for; None: read from base_url
    headers: dict[str, str] = field(default_factory=dict)
    # Who applies the context edits a Messages request asks for (Anthropic's `context_management`):
    # `provider` (the upstream does, as Anthropic's API does: the guard counts the request after
    # them and forwards it as sent) or `guard` (the upstream cannot: the guard applies them, strips
    # the field and the beta flag, and adds what it cleared to the answer). None: by kind, the
    # `anthropic` kind `provider`, every other kind `guard`.
    context_edits: Literal["provider", "guard"] | None = None
    connect_timeout: PositiveFloat = 10.0
    read_timeout: PositiveFloat = 600.0

    def __post_init__(self) -> None:
        try:
            check_url(self.base_url)
        except ValueError as exc:
            raise SchemaError(str(exc), ("base_url",)) from None
        try:
            provider = provider_for(self.kind)
        except ValueError as exc:
            raise SchemaError(str(exc), ("kind",)) from None
        if self.auth == "sigv4" and not provider.signs:
            raise SchemaError(f"auth: sigv4 signs AWS requests; kind {self.kind} signs nothing", ("auth",))
        try:
            provider.check(self)
        except SettingsRefused as exc:
            raise SchemaError(str(exc), (exc.key,)) from None
        for index, api in enumerate(self.apis or ()):
            if api not in API_NAMES:
                raise SchemaError(f"must be one of {', '.join(API_NAMES)}, not {api!r}", ("apis", index))
        if self.auth == "adc" and (self.token_command or self.token_file or self.api_key_env):
            message = "auth: adc fetches the token itself; drop token_command, token_file and api_key_env"
            raise SchemaError(message, ("auth",))
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))
        # Worked out once, here, and read on every request as plain attributes: the kind's
        # provider (everything else asks it, never the kind's name), the shapes served, and
        # whether the guard applies a request's context edits itself (`context_edits`).
        object.__setattr__(self, "provider", provider)
        object.__setattr__(self, "served", frozenset(self.apis if self.apis is not None else provider.shapes))
        by_guard = (self.context_edits or ("provider" if provider.edits_context else "guard")) == "guard"
        object.__setattr__(self, "edits_by_guard", by_guard)

    # Set on each instance by `__post_init__` (not settings: no YAML key names them).
    provider: ClassVar[Provider]  # the object that knows this upstream's kind (`proxy.providers`)
    served: ClassVar[frozenset[str]]  # the API shapes it serves: `apis`, else its provider's
    edits_by_guard: ClassVar[bool]

    @property
    def backend_options(self) -> BackendOptions:
        """How the upstream behaves as a backend: as its provider says (Azure and Anthropic as OpenAI)."""
        return carried(BackendOptions, self, kind=self.provider.backend_kind)

    def serves(self, api: str) -> bool:
        return api in self.served


@dataclass(frozen=True, kw_only=True)
class Route:
    match: str = "*"  # exact model name or glob
    upstream: str
    rename: str | None = None

    def matches(self, model: str) -> bool:
        return self.match == model or fnmatch.fnmatchcase(model, self.match)


def check_url(url: str) -> None:
    if not re.match(r"^https?://[^/\s]+", url):
        raise ValueError(f"{url!r} must start with http:// or https:// and name a host")
