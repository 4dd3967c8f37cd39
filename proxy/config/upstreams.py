"""The `upstreams` and `routes` sections of the settings: where requests go, how each upstream
authenticates and counts, and which model goes where (`proxy.config.settings` reads the whole file)."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Literal

from proxy.config.backends import BackendOptions
from proxy.config.schema import INTERNAL, Bounds, PositiveFloat, SchemaError, carried

UpstreamKind = Literal[
    "auto", "openai", "azure", "vertex", "gemini", "vllm", "llamacpp", "ollama", "anthropic", "generic", "echo",
    "bedrock",
]
# Kinds whose server is asked at start what it is (its window, whether it can tokenize).
DISCOVERED_KINDS = frozenset({"auto", "vllm", "llamacpp", "ollama"})
# How each kind behaves as a backend (proxy.server.backends.profiles); hosted APIs are never probed.
# Gemini's Developer API words its limits as Vertex AI does.
_BACKEND_KIND = {"azure": "openai", "anthropic": "openai", "echo": "openai", "gemini": "vertex", "bedrock": "openai"}
# Kinds whose API applies Anthropic's context edits itself (`UpstreamSettings.context_edits`).
EDITING_KINDS = frozenset({"anthropic"})
ApiName = Literal[
    "chat", "responses", "completions", "messages", "generate_content", "interactions", "converse", "invoke"
]


@dataclass(frozen=True, kw_only=True)
class UpstreamSettings:
    name: str = field(default="", metadata=INTERNAL)  # filled from the key under `upstreams`
    base_url: str
    # Which API shapes it serves, how it authenticates, and how it counts: `auto` asks the server at
    # start (vLLM, llama.cpp, Ollama: its window, its tokenizer; `--upstream URL` is `auto`);
    # `generic` asks nothing.
    kind: UpstreamKind = "generic"
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
    apis: tuple[ApiName, ...] | None = None  # the API shapes it serves; None: what its kind serves
    api_key_env: str | None = None  # injected as the kind's auth header; else the client's passes through
    token_command: str | None = None  # e.g. `gcloud auth print-access-token`
    token_file: str | None = None
    token_refresh_seconds: Annotated[float, Bounds(ge=1)] = 3000.0
    # `adc`: a token from Google's Application Default Credentials (a service-account file, the
    # metadata server on GKE and Cloud Run, gcloud's user credentials), refreshed before it expires.
    # `sigv4` (a `kind: bedrock` upstream): every request signed again with the AWS credentials of
    # the guard's environment (botocore's chain: environment keys, profiles, container and instance
    # roles) for `region`; `proxy.server.bedrock.sigv4`.
    auth: Literal["adc", "sigv4"] | None = None
    region: str | None = None  # AWS's region a `kind: bedrock` upstream signs for; None: read from base_url
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
        if self.auth == "adc" and (self.token_command or self.token_file or self.api_key_env):
            message = "auth: adc fetches the token itself; drop token_command, token_file and api_key_env"
            raise SchemaError(message, ("auth",))
        check_bedrock(self)  # bedrock: its region and its one credential
        object.__setattr__(self, "base_url", self.base_url.rstrip("/"))

    @property
    def backend_options(self) -> BackendOptions:

        kind = _BACKEND_KIND.get(self.kind, self.kind)
        return carried(BackendOptions, self, kind=kind)  # the kinds map onto the backend kinds above

    @property
    def edits_by_guard(self) -> bool:
        """Whether the guard applies a request's context edits itself (`context_edits`)."""
        return (self.context_edits or ("provider" if self.kind in EDITING_KINDS else "guard")) == "guard"

    def serves(self, api: str) -> bool:
        return api in (self.apis if self.apis is not None else KIND_APIS[self.kind])


KIND_APIS: Mapping[str, tuple[str, ...]] = {
    "openai": ("chat", "responses", "completions"),
    "azure": ("chat", "responses", "completions"),
    # Vertex AI: its OpenAI-compatible endpoint and its native `publishers/google` paths (served
    # from the host's root whatever the base URL's path: `proxy.server.edge.paths.host_root_url`).
    "vertex": ("chat", "generate_content", "interactions"),
    "gemini": ("generate_content", "interactions"),  # the Gemini Developer API, base URL at the host's root
    "vllm": ("chat", "responses", "completions"),
    "llamacpp": ("chat", "completions"),
    "ollama": ("chat", "completions"),
    "anthropic": ("messages",),
    "generic": ("chat", "responses", "completions", "messages", "generate_content", "interactions"),
    "echo": ("chat", "responses", "completions", "messages", "generate_content", "interactions", "converse", "invoke"),
    "auto": ("chat", "responses", "completions", "messages"),
    "bedrock": ("converse", "invoke"),  # bedrock-runtime's paths (`/model/{modelId}/...`)
}


# -- bedrock: a few lines kept here until the upstream kinds become objects ------------------------
_BEDROCK_HOST = re.compile(r"^https?://bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?::\d+)?/?$")


def check_bedrock(upstream: UpstreamSettings) -> None:
    """`auth: sigv4` only for a `kind: bedrock` upstream, which signs (with a region, named or read
    from `bedrock-runtime.{region}.amazonaws.com`) or sends an API key, never both, never neither."""
    if upstream.auth == "sigv4" and upstream.kind != "bedrock":
        raise SchemaError("auth: sigv4 signs for AWS Bedrock: it needs kind: bedrock", ("auth",))
    if upstream.kind != "bedrock":
        return
    if upstream.region is None:
        found = _BEDROCK_HOST.match(upstream.base_url)
        object.__setattr__(upstream, "region", found[1] if found else None)
    if upstream.auth == "sigv4" and upstream.region is None:
        raise SchemaError("auth: sigv4 needs the AWS region to sign for (region: us-east-1)", ("region",))
    if upstream.region is not None and not re.fullmatch(r"[a-z]{2}(?:-[a-z]+)+-\d", upstream.region):
        raise SchemaError(f"region {upstream.region!r} is not an AWS region name (us-east-1)", ("region",))
    if (upstream.auth == "sigv4") == bool(upstream.api_key_env) or upstream.token_command or upstream.token_file:
        message = "a bedrock upstream authenticates with auth: sigv4 or api_key_env (a Bedrock API key), one of them"
        raise SchemaError(message, ("auth",))


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
