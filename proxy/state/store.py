"""Learned state: the interface every store offers, its key and options, this process's memory
behind it, and the two things the guard keeps in it (self-corrections, the ledger of what
providers hold).

A key is `<namespace>:<kind>:<upstream>:<model>` with each part percent-quoted, so model names
holding colons (`ft:gpt-4o-mini:org::abc`) can never collide with another key. `MemoryStore`
keeps state in this process, bounded (least recently used goes first) and expiring;
`proxy.state.redis` shares it between replicas.

**Self-corrections** (`SharedCorrections`) are kept in a store so that every replica applies what
one of them learned. The request path reads a model's correction before planning and remembers a
new one after an upstream's context-length error; both go through the store, keyed by upstream and
model (two upstreams serving one model name can count differently). A stored correction only ever
gets tighter: remembering a looser one keeps the stored one.

**The ledger of what the provider holds** (`HeldLedger`): the size of each stored response,
conversation, interaction and cached prompt the guard has seen an answer about. A request that
names held context by id (`previous_response_id`, `conversation`, `cachedContent`,
`previous_interaction_id`) is counted as what the provider holds plus what was sent; the ledger is
where the first part comes from when the guard relayed the answer that made it (a Response's
usage: its input + output; a conversation's latest such total; a cache's `totalTokenCount`).
Entries live in the same store as corrections, bounded as it is and each with an expiry: a cache
until the provider's `expireTime`, the others `HELD_TTL_SECONDS`. Each key names the upstream and
the client: its credential's digest (`proxy.server.edge.credentials.credential_digest`, hashed
again here), so an id one client names is looked up only among the answers that client was given.
Another client can neither read the size of a chain it names by a stolen id nor write one for it:
entries are written only from the provider's own answers, under the credential of the request they
answered.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

from proxy.core.learning.corrections import Correction

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


class MemoryStore:
    def __init__(self, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[StateKey, tuple[Value, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def peek(self, key: StateKey) -> Value | None:
        """`get` without awaiting: for callers (and the Redis store's fallback) on the hot path."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        value, expires = entry
        if expires <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def store(self, key: StateKey, value: Value, ttl_seconds: float) -> None:
        """`put` without awaiting."""
        if ttl_seconds <= 0:
            self._entries.pop(key, None)
            return
        self._entries[key] = (value, self._clock() + ttl_seconds)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def get(self, key: StateKey) -> Value | None:
        return self.peek(key)

    async def put(self, key: StateKey, value: Value, ttl_seconds: float) -> None:
        self.store(key, value, ttl_seconds)

    def status(self) -> StateStatus:
        return StateStatus(backend="memory", shared=False, fallbacks=0, errors=0, last_error=None)

    async def open(self) -> None:
        pass  # nothing to connect to

    async def close(self) -> None:
        self._entries.clear()


KIND = "correction"


class SharedCorrections:
    def __init__(self, store: StateStore, ttl_seconds: float) -> None:
        self.store = store
        self.ttl_seconds = ttl_seconds

    def held(self, upstream: str, model: str) -> tuple[bool, Correction | None]:
        """`get` without awaiting when the store is this process's memory: (True, the correction
        or None); (False, None) when only `get` can say."""
        store = self.store
        if isinstance(store, MemoryStore):
            return True, _correction(store.peek(StateKey(KIND, upstream, model))) if len(store) else None
        return False, None

    async def get(self, upstream: str, model: str) -> Correction | None:
        return _correction(await self.store.get(StateKey(KIND, upstream, model)))

    async def remember(self, upstream: str, model: str, correction: Correction) -> Correction:
        """Store `correction` unless a tighter one is already stored; the one that applies now."""
        key = StateKey(KIND, upstream, model)
        stored = _correction(await self.store.get(key))
        kept = correction if stored is None or correction.window <= stored.window else stored
        await self.store.put(key, kept.to_dict(), self.ttl_seconds)
        return kept


def _correction(value: Any) -> Correction | None:
    """A stored value back as a Correction; anything malformed (another version wrote it) is none."""
    return Correction.from_dict(value) if isinstance(value, dict) else None


HELD_TTL_SECONDS = 7 * 24 * 3600.0  # a chain resumed within a week is counted from the ledger
MAX_ID_CHARS = 512  # no provider's id is longer: a longer one is never looked up nor kept
KINDS = frozenset({"response", "conversation", "interaction", "cache"})
ANONYMOUS = "anonymous"  # requests without a credential share the upstream's, and its ids


@dataclass(frozen=True, slots=True)
class HeldSize:
    """What one held context weighs in a prompt, as the provider reported it."""

    tokens: int


def client_of(digest: bytes | None) -> str:
    """The ledger's name for a client: a digest of its credential's digest (the stored key never
    holds what the credential is hashed to elsewhere), or `ANONYMOUS` when it presents none."""
    if digest is None:
        return ANONYMOUS
    return hashlib.blake2b(digest, digest_size=12, person=b"held-ledger").hexdigest()


class HeldLedger:
    """`get` and `put` of held sizes by upstream, client, kind and id, in a `StateStore`."""

    def __init__(self, store: StateStore, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self._clock = clock

    @staticmethod
    def key(upstream: str, client: str, kind: str, ident: str) -> StateKey | None:
        """The key of one entry; None for a kind or id that is never kept."""
        if kind not in KINDS or not 0 < len(ident) <= MAX_ID_CHARS or not upstream:
            return None
        return StateKey(f"held-{kind}", upstream, f"{client}/{ident}")

    async def get(self, upstream: str, client: str, kind: str, ident: str) -> HeldSize | None:
        key = self.key(upstream, client, kind, ident)
        if key is None:
            return None
        value = await self.store.get(key)
        tokens = value.get("tokens") if isinstance(value, dict) else None
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 0:
            return None  # nothing kept, or written by another version
        return HeldSize(tokens)

    async def put(
        self, upstream: str, client: str, held: tuple[str, str, int], expires_at: float | None = None
    ) -> None:
        """Keep `held` (kind, id, tokens) until `expires_at` (Unix seconds), else `HELD_TTL_SECONDS`."""
        kind, ident, tokens = held
        key = self.key(upstream, client, kind, ident)
        if key is None or tokens < 0:
            return
        ttl = HELD_TTL_SECONDS if expires_at is None else min(HELD_TTL_SECONDS, expires_at - self._clock())
        if ttl <= 0:
            return
        await self.store.put(key, {"tokens": tokens}, ttl)
