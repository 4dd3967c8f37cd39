"""Where the settings come from: the config file, then the command line's and the environment's
overrides (`--upstream`, `--host`, `--port`, `HOST`, `PORT`); read afresh at start and on SIGHUP."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.config.schema import reason
from proxy.config.settings import Settings, load_settings
from proxy.errors import ConfigError


@dataclass(frozen=True, slots=True)
class SettingsSource:
    """Where the settings come from; `load()` reads them afresh (at start and on SIGHUP)."""

    config: str | None = None
    upstream: str | None = None  # --upstream: every route goes to this base URL
    host: str | None = None
    port: int | None = None

    def load(self, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        settings = load_settings(self.config, env)
        if self.upstream and self.upstream != "echo":
            try:
                settings = settings.with_upstream_url(self.upstream)
            except ValueError as exc:
                raise ConfigError(reason(exc), key="--upstream") from None
        for name, flag in (("host", self.host), ("port", self.port)):
            given, where = (flag, f"--{name}") if flag is not None else (env.get(name.upper()), "environment")
            if given is None or given == "":
                continue
            try:
                settings = settings.with_server(**{name: given})
            except ValueError as exc:
                key = name.upper() if where == "environment" else None
                raise ConfigError(reason(exc), source=where, key=key) from None
        return settings
