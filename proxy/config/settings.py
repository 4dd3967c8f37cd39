"""YAML -> one frozen `Settings`, built once at start (and again, whole, on a reload).

The schema is written once, here, as frozen dataclasses whose type hints `proxy.config.schema`
checks: every section forbids unknown keys, so a typo is an error instead of a silent default,
and the defaults, the validation and `config/context-guard.yaml` (a test keeps it equal to the
defaults) cannot drift apart.

`${VAR}` and `${VAR:-default}` are replaced from the environment *before* validation, so
`port: ${PORT:-9000}` is a number and `allow_mode_header: ${DEBUG:-false}` a boolean. Every
error names the file, the dotted key and the reason (`cg.yaml: server.port: must be ...`): the
loader turns the schema's first error into one `ConfigError`.

With no file, the defaults apply: listen on 127.0.0.1:8080, forward the OpenAI API surface to
OpenAI with the key in OPENAI_API_KEY, enforce budgets.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml

from proxy.apis.openai.completions import CompletionsOptions
from proxy.config.budget_and_trim import BudgetSettings, Mode, TrimSettings
from proxy.config.environment import expand_environment
from proxy.config.schema import INTERNAL, Bounds, PositiveFloat, SchemaError, build, dotted, plain, shallow
from proxy.config.upstreams import Route, UpstreamSettings
from proxy.core.counting.count_cache import DEFAULT_CACHE_BYTES
from proxy.core.learning.calibration import CalibrationPolicy
from proxy.core.learning.corrections import CorrectionPolicy
from proxy.core.models.model_registry import ModelOverride, TokenizerSpec
from proxy.core.plan import TrimPolicy
from proxy.core.trimming.compaction import CompactionPolicy
from proxy.core.trimming.strategies import build_pipeline
from proxy.errors import ConfigError

if TYPE_CHECKING:
    pass
from proxy.state.store import StateOptions

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
Port = Annotated[int, Bounds(ge=0, le=65535)]


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: Port = 8080
    max_body_bytes: Annotated[int, Bounds(ge=1024)] = 32 * 1024 * 1024
    offload_bytes: Annotated[int, Bounds(ge=0)] = 256 * 1024  # count bodies with more new bytes in a worker thread
    # Earlier bodies kept so that a conversation re-sent with a new turn is parsed only where it is new
    # (`proxy.wire.prefix_reader`); 0 turns it off. Their parsed values take about three times this.
    prefix_memory_bytes: Annotated[int, Bounds(ge=0)] = 8 * 1024 * 1024
    client_keys: tuple[str, ...] = ()
    allow_mode_header: bool = False
    # Listening beyond loopback while injecting an upstream credential with no client keys is refused
    # unless this says the operator means it.
    allow_unauthenticated: bool = False
    metrics_public: bool = False  # /metrics without a client key even when keys are configured
    body_timeout_seconds: PositiveFloat = 60.0  # a request body that takes longer to arrive gets 408
    max_json_depth: Annotated[int, Bounds(ge=8, le=10_000)] = 64
    # Which other paths are forwarded: all, none, or these prefixes (the OpenAI API surface by default).
    passthrough: Literal["all", "none"] | tuple[str, ...] = ("/v1/",)
    upstream_connections: Annotated[int, Bounds(ge=1)] = 1024
    connection_wait_seconds: PositiveFloat = 5.0  # a full pool answers 503 overloaded after this
    workers: Annotated[int, Bounds(ge=0, le=256)] = 0  # 0: one per available core
    drain_delay_seconds: Annotated[float, Bounds(ge=0, le=600)] = 0.0
    shutdown_grace_seconds: Annotated[float, Bounds(ge=0, le=3600)] = 30.0
    # Request bodies held at once by one serving process, compressed and inflated bytes counted
    # (past it: 503), and by one client (past it: 429); unset, three and two bodies of max_body_bytes.
    # docs/security.md ("The memory bound") turns them into memory; deploy/kubernetes's limit follows.
    body_memory_bytes: Annotated[int, Bounds(ge=2048)] | None = None
    client_body_memory_bytes: Annotated[int, Bounds(ge=2048)] | None = None

    def __post_init__(self) -> None:
        total, per_client = self.body_memory
        if per_client < 2 * self.max_body_bytes:  # a compressed body of the limit, and what it inflates to
            where = "client_body_memory_bytes" if self.client_body_memory_bytes is not None else "body_memory_bytes"
            raise SchemaError(f"a client's share ({per_client:,}) must hold two bodies of max_body_bytes", (where,))
        if per_client > total:
            raise SchemaError(f"must be at most body_memory_bytes ({total:,})", ("client_body_memory_bytes",))
        if any(not key.strip() for key in self.client_keys):
            message = "a client key is empty (is its environment variable set?); remove it or set it"
            raise SchemaError(message, ("client_keys",))
        if isinstance(self.passthrough, tuple) and any(not p.startswith("/") for p in self.passthrough):
            raise SchemaError("every passthrough prefix must start with /", ("passthrough",))

    @property
    def body_memory(self) -> tuple[int, int]:
        """(bytes of request bodies held at once, a client's share of them), defaults applied."""
        total = self.body_memory_bytes or 3 * self.max_body_bytes
        return total, self.client_body_memory_bytes or min(total, 2 * self.max_body_bytes)


@dataclass(frozen=True, kw_only=True)
class LogSettings:
    format: Literal["auto", "json", "console"] = "auto"
    level: Literal["debug", "info", "warning", "error"] = "info"
    content_preview_chars: Annotated[int, Bounds(ge=0)] = 0
    # The removals list is folded to fit. By default a line and its newline are at most PIPE_BUF
    # (4,096 bytes): one atomic write to a pipe, so the lines of workers sharing stdout never interleave.
    max_line_bytes: Annotated[int, Bounds(ge=1024)] = 4095


@dataclass(frozen=True, kw_only=True)
class TokenizerSettings:
    encodings_dir: str | None = None
    cache_entries: Annotated[int, Bounds(ge=0)] = 100_000
    # The count cache's memory, as `proxy.core.counting.count_cache.entry_bytes` estimates it (about 460 bytes
    # a chat message's entry); whichever bound is reached first evicts. 0: no cache.
    cache_bytes: Annotated[int, Bounds(ge=0)] = DEFAULT_CACHE_BYTES
    # Counts are remembered per client (a hash of its credential, else its connection), so that how
    # long a request takes cannot tell one client whether another sent a text. True: one cache for
    # all clients (more hits when many clients send the same long texts; only for clients that trust
    # each other).
    share_count_cache: bool = False
    # Vocabularies loaded at start, before the process is ready, beside the configured models'
    # (proxy.tokenizers.at_start): `auto`, what the upstreams' kinds serve; `all`, every family's;
    # or model names, theirs besides `auto`'s. Any other loads on first use, holding the loop once.
    preload: Literal["auto", "all"] | tuple[Annotated[str, Bounds(min_length=1)], ...] = "auto"


@dataclass(frozen=True, kw_only=True)
class ModelOverrideSettings:
    match: Annotated[str, Bounds(min_length=1)]
    context_window: Annotated[int, Bounds(ge=256)] | None = None
    max_output_tokens: Annotated[int, Bounds(ge=1)] | None = None
    tokenizer: str | None = None
    alias_of: str | None = None
    mode: Mode | None = None

    def __post_init__(self) -> None:
        if self.tokenizer is not None:
            try:
                TokenizerSpec.parse(self.tokenizer)
            except ValueError as exc:
                raise SchemaError(str(exc), ("tokenizer",)) from None

    @cached_property
    def override(self) -> ModelOverride:
        spec = TokenizerSpec.parse(self.tokenizer) if self.tokenizer else None
        return ModelOverride(self.match, self.context_window, self.max_output_tokens, spec, self.alias_of)


@dataclass(frozen=True, kw_only=True)
class ModelsSettings:
    map_file: str | None = None
    fallback_context_window: Annotated[int, Bounds(ge=256)] = 8192
    overrides: tuple[ModelOverrideSettings, ...] = ()


@dataclass(frozen=True, kw_only=True)
class SelfCorrectionSettings:
    enabled: bool = True
    # A provider's stated limit is believed only within this share of the window we know for the model.
    plausible_min_ratio: Annotated[float, Bounds(gt=0, le=1)] = 0.25
    plausible_min_tokens: Annotated[int, Bounds(ge=1)] = 1024
    max_factor: Annotated[float, Bounds(ge=1)] = 4.0  # provider count / our count above this is not believed
    ttl_seconds: PositiveFloat = 24 * 3600.0

    @property
    def policy(self) -> CorrectionPolicy | None:
        """None when switched off."""
        if not self.enabled:
            return None
        return CorrectionPolicy(self.plausible_min_ratio, self.plausible_min_tokens, self.max_factor)


@dataclass(frozen=True, kw_only=True)
class ReadinessSettings:
    """What `/readyz` requires besides a loaded config and not draining."""

    require_upstreams: bool = True  # False: /readyz ignores upstream reachability
    reachable_within_seconds: PositiveFloat = 30.0  # an upstream counts as reachable this long after contact
    probe_interval_seconds: Annotated[float, Bounds(gt=0, le=3600)] = 5.0
    probe_timeout_seconds: Annotated[float, Bounds(gt=0, le=60)] = 2.0

    def __post_init__(self) -> None:
        if self.reachable_within_seconds < self.probe_interval_seconds:
            raise SchemaError(
                "must be at least readiness.probe_interval_seconds "
                f"({self.probe_interval_seconds}), not {self.reachable_within_seconds}",
                ("reachable_within_seconds",),
            )


@dataclass(frozen=True, kw_only=True)
class CompletionsSettings:
    overflow: Literal["cut", "reject"] = "cut"  # a legacy prompt over budget: cut its middle, or refuse it
    min_prompt_tokens: Annotated[int, Bounds(ge=0)] = 256  # a cut never leaves the prompt shorter than this

    @property
    def options(self) -> CompletionsOptions:
        return CompletionsOptions(self.overflow, self.min_prompt_tokens)


@dataclass(frozen=True, kw_only=True)
class ApisSettings:
    completions: CompletionsSettings = CompletionsSettings()


@dataclass(frozen=True, kw_only=True)
class CalibrationSettings:
    """Learning each estimated model's real count from `usage.prompt_tokens` (never applied to an
    exact tokenizer): undercounts corrected at once, overcounts loosened slowly, with evidence."""

    quantile: Annotated[float, Bounds(ge=0.5, le=1.0)] = 0.9  # of the recent ratios
    window: Annotated[int, Bounds(ge=1)] = 32  # recent ratios kept per upstream and model
    min_samples: Annotated[int, Bounds(ge=1)] = 3  # observations before the factor may go down
    max_step: Annotated[float, Bounds(gt=0, le=1)] = 0.25  # the most the factor falls per observation
    min_factor: Annotated[float, Bounds(gt=0)] = 0.25
    max_factor: Annotated[float, Bounds(gt=0)] = 4.0
    headroom: Annotated[float, Bounds(ge=0, le=0.5)] = 0.02  # on top of the learned ratio
    min_tokens: Annotated[int, Bounds(ge=0)] = 64  # smaller requests teach nothing

    @cached_property
    def policy(self) -> CalibrationPolicy:
        return CalibrationPolicy(**shallow(self))


@dataclass(frozen=True, kw_only=True)
class PageSettings:
    enabled: bool = True  # GET /context-guard/recent: the last decisions, no content ever
    size: Annotated[int, Bounds(ge=1, le=100_000)] = 500
    admin_key_env: str | None = None  # else the client keys guard it (and it is loopback-only without keys)


def _default_upstreams() -> dict[str, UpstreamSettings]:
    openai = UpstreamSettings(
        name="openai", base_url="https://api.openai.com/v1", kind="openai", api_key_env="OPENAI_API_KEY"
    )
    return {"openai": openai}


@dataclass(frozen=True, kw_only=True)
class Settings:
    source: str = field(default="<defaults>", compare=False, metadata=INTERNAL)
    server: ServerSettings = ServerSettings()
    log: LogSettings = LogSettings()
    budget: BudgetSettings = BudgetSettings()
    trim: TrimSettings = TrimSettings()
    tokenizers: TokenizerSettings = TokenizerSettings()
    models: ModelsSettings = ModelsSettings()
    upstreams: Annotated[dict[str, UpstreamSettings], Bounds(min_length=1)] = field(default_factory=_default_upstreams)
    routes: tuple[Route, ...] = ()
    self_correction: SelfCorrectionSettings = SelfCorrectionSettings()
    state: StateOptions = StateOptions()
    readiness: ReadinessSettings = ReadinessSettings()
    page: PageSettings = PageSettings()
    apis: ApisSettings = ApisSettings()
    calibration: CalibrationSettings = CalibrationSettings()

    def __post_init__(self) -> None:
        if not self.routes:
            object.__setattr__(self, "routes", (Route(match="*", upstream=next(iter(self.upstreams))),))
        known = ", ".join(self.upstreams)
        summariser = self.trim.summariser
        where = ("trim", "summariser", "upstream")
        if summariser is not None and summariser.upstream not in self.upstreams:
            raise SchemaError(f"{summariser.upstream!r} is not one of the upstreams: {known}", where)
        serving = self.upstreams[summariser.upstream] if summariser is not None else None
        if serving is not None and (not serving.serves("chat") or not serving.provider.chat_at_base_url):
            raise SchemaError("must serve chat completions at base_url/chat/completions", where)
        for i, route in enumerate(self.routes):
            if route.upstream not in self.upstreams:
                raise SchemaError(f"{route.upstream!r} is not one of the upstreams: {known}", ("routes", i, "upstream"))

    @classmethod
    def of(cls, data: Mapping[str, Any]) -> Settings:
        """Settings from plain data (sections as mappings, or built already), checked whole; each
        upstream takes its name from its key."""
        upstreams = data.get("upstreams")
        if isinstance(upstreams, Mapping):
            named = {k: {**v, "name": k} if isinstance(v, Mapping) else v for k, v in upstreams.items()}
            data = {**data, "upstreams": named}
        return build(cls, data)  # type: ignore[no-any-return]  # build returns the class it is given

    @cached_property
    def trim_policy(self) -> TrimPolicy:
        pipeline = build_pipeline(self.trim.pipeline, self.trim.options)
        trim = self.trim
        compaction = CompactionPolicy(
            budget_note=trim.budget_note,
            summarize_dropped=trim.summarize_dropped,
            summary_share=trim.summary_share,
            summary_max_tokens=trim.summary_max_tokens,
        )
        return TrimPolicy(
            budget=self.budget.policy, pipeline=pipeline, overflow=self.trim.overflow, compaction=compaction
        )

    def with_upstream_url(self, url: str) -> Settings:
        """The `--upstream` flag: every route goes to one upstream at `url`, whose kind is unknown."""
        upstream = UpstreamSettings(name="cli", base_url=url, kind="auto")
        return self.revalidated(upstreams={"cli": upstream}, routes=(Route(match="*", upstream="cli"),))

    def revalidated(self, **changes: Any) -> Settings:
        """These settings with `changes`, validated whole again (a summariser naming an upstream
        that is gone is an error, not a crash later)."""
        return Settings.of({**shallow(self), **changes})

    def with_server(self, **changes: Any) -> Settings:
        """Command-line flags (`--host`, `--port`, ...) over the file's server section, validated."""
        return dataclasses.replace(self, server=build(ServerSettings, {**shallow(self.server), **changes}))

    def exposure_problem(self, env: Mapping[str, str]) -> str | None:
        """Why this config must not start: listening beyond loopback, injecting an upstream
        credential, with no client keys. None when it may start (or the operator opted out, which
        `unauthenticated_warning` then reports)."""
        server = self.server
        if server.host in LOOPBACK_HOSTS or server.client_keys or server.allow_unauthenticated:
            return None
        return self._exposed(env)

    def unauthenticated_warning(self, env: Mapping[str, str]) -> str | None:
        if self.server.host in LOOPBACK_HOSTS or self.server.client_keys:
            return None
        return self._exposed(env)

    def _exposed(self, env: Mapping[str, str]) -> str | None:
        injecting = [
            u.name
            for u in self.upstreams.values()
            if u.token_command or u.token_file or u.auth or (u.api_key_env and env.get(u.api_key_env))
        ]
        if not injecting:
            return None
        return (
            f"listening on {self.server.host} and injecting the credential of upstream(s) {', '.join(injecting)} "
            "with no client keys: anyone who reaches the port spends that credential. Set server.client_keys, "
            "listen on 127.0.0.1, or set server.allow_unauthenticated: true to accept this"
        )


def load_settings(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None) -> Settings:
    environ = os.environ if env is None else env
    if path is None:
        return settings_from_dict({}, "<defaults>", environ)
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", source=source) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", source=source) from None
    return settings_from_dict(data or {}, source, environ)


def settings_from_dict(data: object, source: str, env: Mapping[str, str]) -> Settings:
    if not isinstance(data, Mapping):
        raise ConfigError("the file must hold a mapping of sections", source=source)
    if "source" in data:
        raise ConfigError("unknown setting", source=source, key="source")
    expanded = expand_environment(data, env, source)
    try:
        return Settings.of({**expanded, "source": source})
    except SchemaError as exc:
        raise ConfigError(exc.message, source=source, key=dotted(exc.location) or None) from None


def masked(settings: Settings) -> dict[str, Any]:
    """The effective settings as plain data, with every secret value masked (for `check-config`)."""
    data: dict[str, Any] = plain(settings)
    data["server"]["client_keys"] = ["***" for _ in settings.server.client_keys]
    for upstream in data["upstreams"].values():
        upstream.pop("name", None)
        upstream["headers"] = {k: "***" for k in upstream["headers"]}
    return data
