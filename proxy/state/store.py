"""The state interface, its key and its options.

A key is `<namespace>:<kind>:<upstream>:<model>` with each part percent-quoted, so model names
holding colons (`ft:gpt-4o-mini:org::abc`) can never collide with another key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

Value = Any  # JSON-serialisable: None, bool, int, float, str, list, dict


@dataclass(frozen=True, slots=True)
class StateKey:
    kind: str  # what is stored: "correction", "calibration", ...
    upstream: str
    model: str

    def __post_init__(self) -> None:
        for name in ("kind", "upstream", "model"):
            if not getattr(self, name):
                raise ValueError(f"a state key needs a non-empty {name}")

    def render(self, namespace: str) -> str:
        return ":".join(quote(part, safe="") for part in (namespace, self.kind, self.upstream, self.model))


@dataclass(frozen=True, slots=True)
class StateOptions:
    """`state.*` settings. With no `url`, learned state stays in this process, as before."""

    # Built by the settings schema as the `state` section (`proxy.config.schema`): types checked
    # there, unknown keys refused; the limits are checked here.
    url: str | None = None  # redis://host:6379/0 or rediss://...; None keeps state in memory
    deadline_ms: float = 50.0  # the longest a request waits on Redis before using local state
    local_cache_seconds: float = 2.0  # how long a value read from Redis is reused without asking again
    retry_seconds: float = 1.0  # after a failure, Redis is left alone this long (requests use local state)
    namespace: str = "context-guard"
    max_local_entries: int = 10_000

    def __post_init__(self) -> None:
        if self.url is not None and not self.url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"state.url must start with redis://, rediss:// or unix://, not {self.url!r}")
        if not 1 <= self.deadline_ms <= 10_000:
            raise ValueError(f"state.deadline_ms must be between 1 and 10000, not {self.deadline_ms}")
        if not 0 <= self.local_cache_seconds <= 3600:
            raise ValueError(f"state.local_cache_seconds must be between 0 and 3600, not {self.local_cache_seconds}")
        if not 0 < self.retry_seconds <= 600:
            raise ValueError(f"state.retry_seconds must be above 0 and at most 600, not {self.retry_seconds}")
        if not self.namespace or ":" in self.namespace:
            raise ValueError(f"state.namespace must be a non-empty name without ':', not {self.namespace!r}")
        if self.max_local_entries < 1:
            raise ValueError(f"state.max_local_entries must be at least 1, not {self.max_local_entries}")


@dataclass(frozen=True, slots=True)
class StateStatus:
    """What `/metrics` and the log report about the store."""

    backend: str  # "memory" or "redis"
    shared: bool  # True while values are being read from and written to Redis
    fallbacks: int  # reads and writes that used local state because Redis was slow or down
    errors: int  # Redis calls that failed or missed the deadline
    last_error: str | None


class StateStore(Protocol):
    async def get(self, key: StateKey) -> Value | None:
        """The value stored under `key`, or None when there is none (or it expired)."""
        ...

    async def put(self, key: StateKey, value: Value, ttl_seconds: float) -> None:
        """Store `value` under `key` for `ttl_seconds`. Never raises for an unreachable backend."""
        ...

    def status(self) -> StateStatus: ...

    async def open(self) -> None:
        """Get ready for the first request (connect to the backend), in bounded time. Never raises."""
        ...

    async def close(self) -> None: ...
