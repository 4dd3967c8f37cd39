"""YAML -> one frozen `Settings`, built once at start.

Every value is checked here, and a bad one is a `ConfigError` naming the file and the dotted
key (`context-guard.yaml: upstreams.vertex.base_url: must start with http:// or https://`).
Unknown keys are errors too, so a typo never silently falls back to a default. `${VAR}` and
`${VAR:-default}` in string values are replaced from the environment.

With no file, the defaults below apply: listen on 127.0.0.1:8080, forward everything to
OpenAI, enforce budgets. `config/context-guard.yaml` spells out every setting with its default.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml

from proxy.core.budget import BudgetPolicy
from proxy.core.models import ModelOverride, TokenizerSpec
from proxy.core.plan import TrimPolicy
from proxy.core.strategies import DEFAULT_PIPELINE, STRATEGIES, build_pipeline
from proxy.errors import ConfigError

Mode = Literal["enforce", "dry_run", "off"]
MODES: tuple[Mode, ...] = ("enforce", "dry_run", "off")
T = TypeVar("T")


@dataclass(frozen=True)
class UpstreamSettings:
    name: str
    base_url: str
    api_key_env: str | None = None  # injected as `Authorization: Bearer`; else the client's passes through
    token_command: str | None = None  # e.g. `gcloud auth print-access-token`
    token_file: str | None = None
    token_refresh_seconds: float = 3000.0
    headers: Mapping[str, str] = field(default_factory=dict)
    connect_timeout: float = 10.0
    read_timeout: float = 600.0


@dataclass(frozen=True)
class Route:
    match: str  # exact model name or glob
    upstream: str
    rename: str | None = None


@dataclass(frozen=True)
class ModelSettings:
    override: ModelOverride
    mode: Mode | None = None


@dataclass(frozen=True)
class Settings:
    source: str = "<defaults>"
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 32 * 1024 * 1024
    offload_bytes: int = 256 * 1024  # count bodies larger than this in a worker thread
    client_keys: tuple[str, ...] = ()
    allow_mode_header: bool = False
    mode: Mode = "enforce"
    log_format: Literal["auto", "json", "console"] = "auto"
    log_level: str = "info"
    content_preview_chars: int = 0
    trim: TrimPolicy = field(default_factory=TrimPolicy)
    encodings_dir: str | None = None
    cache_entries: int = 100_000
    model_map_file: str | None = None
    fallback_context_window: int = 8192
    models: tuple[ModelSettings, ...] = ()
    upstreams: Mapping[str, UpstreamSettings] = field(
        default_factory=lambda: {
            "openai": UpstreamSettings("openai", "https://api.openai.com/v1", api_key_env="OPENAI_API_KEY")
        }
    )
    routes: tuple[Route, ...] = (Route("*", "openai"),)
    self_correction: bool = True

    def with_upstream_url(self, url: str) -> Settings:
        """The `--upstream` flag: every route goes to one upstream at `url`."""
        _check_url(url)
        upstream = UpstreamSettings("cli", url.rstrip("/"), api_key_env=None)
        return replace(self, upstreams={"cli": upstream}, routes=(Route("*", "cli"),))


def load_settings(path: str | os.PathLike[str] | None, env: Mapping[str, str] | None = None) -> Settings:
    if path is None:
        return Settings()
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", source=source) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", source=source) from None
    return settings_from_dict(data or {}, source, os.environ if env is None else env)


def settings_from_dict(data: object, source: str, env: Mapping[str, str]) -> Settings:
    root = _Section(_expand(data, env, source, ""), source, "")
    server, log, budget, trim = (
        root.section("server"),
        root.section("log"),
        root.section("budget"),
        root.section("trim"),
    )
    tokenizers, models, correction = root.section("tokenizers"), root.section("models"), root.section("self_correction")
    root.done({"server", "log", "budget", "trim", "tokenizers", "models", "upstreams", "routes", "self_correction"})
    d = Settings()

    policy = root.build(
        "budget",
        lambda: BudgetPolicy(
            reserve_ratio=budget.number("output_reserve_ratio", 0.15),
            reserve_min=budget.integer("output_reserve_min", 500),
            reserve_max=budget.integer("output_reserve_max", 4096),
            safety_ratio=budget.number("safety_margin_ratio", 0.05),
            safety_min=budget.integer("safety_margin_min", 0),
            constrained_below=budget.integer("constrained_below", 1000),
        ),
    )
    budget.done(
        {
            "output_reserve_ratio",
            "output_reserve_min",
            "output_reserve_max",
            "safety_margin_ratio",
            "safety_margin_min",
            "constrained_below",
        }
    )
    names = tuple(trim.strings("pipeline", list(DEFAULT_PIPELINE)))
    options = trim.section("options")
    for name in options:
        if name not in STRATEGIES:
            raise options.error(name, f"unknown strategy; known: {', '.join(STRATEGIES)}")
    pipeline = trim.build("pipeline", lambda: build_pipeline(names, options.raw))
    overflow = trim.choice("overflow", ("reject", "forward"), "reject")
    mode = trim.choice("mode", MODES, d.mode)
    trim.done({"pipeline", "options", "overflow", "mode"})

    upstreams = _upstreams(root)
    routes = _routes(root, upstreams)
    settings = Settings(
        source=source,
        host=server.string("host", d.host),
        port=server.integer("port", d.port, lo=0, hi=65535),
        max_body_bytes=server.integer("max_body_bytes", d.max_body_bytes, lo=1024),
        offload_bytes=server.integer("offload_bytes", d.offload_bytes, lo=0),
        client_keys=tuple(k for k in server.strings("client_keys", []) if k),
        allow_mode_header=server.boolean("allow_mode_header", d.allow_mode_header),
        mode=mode,
        log_format=log.choice("format", ("auto", "json", "console"), d.log_format),
        log_level=log.choice("level", ("debug", "info", "warning", "error"), d.log_level),
        content_preview_chars=log.integer("content_preview_chars", 0, lo=0),
        trim=TrimPolicy(budget=policy, pipeline=pipeline, overflow=overflow),
        encodings_dir=tokenizers.optional_string("encodings_dir"),
        cache_entries=tokenizers.integer("cache_entries", d.cache_entries, lo=0),
        model_map_file=models.optional_string("map_file"),
        fallback_context_window=models.integer("fallback_context_window", d.fallback_context_window, lo=256),
        models=_model_overrides(models),
        upstreams=upstreams,
        routes=routes,
        self_correction=correction.boolean("enabled", True),
    )
    server.done({"host", "port", "max_body_bytes", "offload_bytes", "client_keys", "allow_mode_header"})
    log.done({"format", "level", "content_preview_chars"})
    tokenizers.done({"encodings_dir", "cache_entries"})
    models.done({"map_file", "fallback_context_window", "overrides"})
    correction.done({"enabled"})
    return settings


def _upstreams(root: _Section) -> dict[str, UpstreamSettings]:
    section = root.section("upstreams")
    if not section.raw:
        return dict(Settings().upstreams)
    upstreams = {}
    for name in section:
        u = section.section(name)
        base_url = u.string("base_url", "")
        u.build("base_url", partial(_check_url, base_url))
        headers = u.section("headers")
        upstreams[name] = UpstreamSettings(
            name=name,
            base_url=base_url.rstrip("/"),
            api_key_env=u.optional_string("api_key_env"),
            token_command=u.optional_string("token_command"),
            token_file=u.optional_string("token_file"),
            token_refresh_seconds=u.number("token_refresh_seconds", 3000.0, lo=1.0),
            headers={k: headers.string(k, "") for k in headers},
            connect_timeout=u.number("connect_timeout", 10.0, lo=0.001),
            read_timeout=u.number("read_timeout", 600.0, lo=0.001),
        )
        u.done(
            {
                "base_url",
                "api_key_env",
                "token_command",
                "token_file",
                "token_refresh_seconds",
                "headers",
                "connect_timeout",
                "read_timeout",
            }
        )
    return upstreams


def _routes(root: _Section, upstreams: Mapping[str, UpstreamSettings]) -> tuple[Route, ...]:
    items = root.items("routes")
    if not items:
        return (Route("*", next(iter(upstreams))),)
    routes = []
    for i, item in enumerate(items):
        r = root.item("routes", i, item)
        upstream = r.string("upstream", "")
        if upstream not in upstreams:
            raise r.error("upstream", f"{upstream!r} is not one of the upstreams: {', '.join(upstreams)}")
        routes.append(Route(r.string("match", "*"), upstream, r.optional_string("rename")))
        r.done({"match", "upstream", "rename"})
    return tuple(routes)


def _model_overrides(models: _Section) -> tuple[ModelSettings, ...]:
    out = []
    for i, item in enumerate(models.items("overrides")):
        m = models.item("overrides", i, item)
        tokenizer = m.optional_string("tokenizer")
        spec = m.build("tokenizer", partial(TokenizerSpec.parse, tokenizer)) if tokenizer else None
        window = m.optional_integer("context_window", lo=256)
        output = m.optional_integer("max_output_tokens", lo=1)
        mode = m.choice("mode", MODES, None) if "mode" in m.raw else None
        override = ModelOverride(m.string("match", ""), window, output, spec, m.optional_string("alias_of"))
        if not override.pattern:
            raise m.error("match", "is required")
        out.append(ModelSettings(override, mode))
        m.done({"match", "context_window", "max_output_tokens", "tokenizer", "alias_of", "mode"})
    return tuple(out)


def _check_url(url: str) -> None:
    if not re.match(r"^https?://[^/\s]+", url):
        raise ValueError(f"{url!r} must start with http:// or https:// and name a host")


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def _expand(value: object, env: Mapping[str, str], source: str, key: str) -> Any:
    if isinstance(value, str):

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(f"environment variable {name} is not set", source=source, key=key)

        return _ENV_REF.sub(substitute, value)
    if isinstance(value, dict):
        return {k: _expand(v, env, source, f"{key}.{k}".lstrip(".")) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, env, source, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


class _Section:
    """One mapping of the YAML document, read with type checks that name the dotted key."""

    def __init__(self, raw: object, source: str, path: str) -> None:
        self.source, self.path = source, path
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError("must be a mapping", source=source, key=path or None)
        self.raw: dict[str, Any] = raw

    def key(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else str(name)

    def error(self, name: str, message: str) -> ConfigError:
        return ConfigError(message, source=self.source, key=self.key(name))

    def keys(self) -> list[str]:
        return [str(k) for k in self.raw]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def section(self, name: str) -> _Section:
        return _Section(self.raw.get(name), self.source, self.key(name))

    def items(self, name: str) -> list[Any]:
        value = self.raw.get(name) or []
        if not isinstance(value, list):
            raise self.error(name, "must be a list")
        return value

    def item(self, name: str, index: int, value: object) -> _Section:
        return _Section(value, self.source, f"{self.key(name)}[{index}]")

    def done(self, known: set[str]) -> None:
        unknown = sorted(set(map(str, self.raw)) - known)
        if unknown:
            raise self.error(unknown[0], f"unknown setting; known here: {', '.join(sorted(known))}")

    def build(self, name: str, make: Callable[[], T]) -> T:
        try:
            return make()
        except ValueError as exc:
            raise self.error(name, str(exc)) from None

    def _get(self, name: str, default: Any, kinds: tuple[type, ...], what: str) -> Any:
        value = self.raw.get(name, default)
        if value is None and default is None:
            return None
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            raise self.error(name, f"must be {what}, not {value!r}")
        return value

    def string(self, name: str, default: str) -> str:
        return str(self._get(name, default, (str,), "a string"))

    def optional_string(self, name: str) -> str | None:
        value = self._get(name, None, (str,), "a string")
        return value or None

    def integer(self, name: str, default: int, lo: int | None = None, hi: int | None = None) -> int:
        value = int(self._get(name, default, (int,), "a whole number"))
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise self.error(name, f"must be between {lo} and {hi if hi is not None else 'any'}, not {value}")
        return value

    def optional_integer(self, name: str, lo: int) -> int | None:
        return self.integer(name, 0, lo=lo) if self.raw.get(name) is not None else None

    def number(self, name: str, default: float, lo: float | None = None) -> float:
        value = float(self._get(name, default, (int, float), "a number"))
        if lo is not None and value < lo:
            raise self.error(name, f"must be at least {lo}, not {value}")
        return value

    def boolean(self, name: str, default: bool) -> bool:
        return bool(self._get(name, default, (bool,), "true or false"))

    def strings(self, name: str, default: list[str]) -> list[str]:
        value = self._get(name, default, (list,), "a list of strings")
        if not all(isinstance(v, str) for v in value):
            raise self.error(name, "must be a list of strings")
        return list(value)

    def choice(self, name: str, choices: tuple[Any, ...], default: Any) -> Any:
        value = self.raw.get(name, default)
        if value not in choices:
            raise self.error(name, f"must be one of {', '.join(map(str, choices))}, not {value!r}")
        return value
