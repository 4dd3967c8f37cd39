"""The ledger of what the provider holds: the size of each stored response, conversation,
interaction and cached prompt the guard has seen an answer about, kept in the learned-state store.

A request that names held context by id (`previous_response_id`, `conversation`, `cachedContent`,
`previous_interaction_id`) is counted as what the provider holds plus what was sent; the ledger
is where the first part comes from when the guard relayed the answer that made it (a Response's
usage: its input + output; a conversation's latest such total; a cache's `totalTokenCount`).

Entries live in the same store as corrections (`proxy.state`: this process's memory, or Redis
shared by every replica), bounded as it is and each with an expiry: a cache until the provider's
`expireTime`, the others `HELD_TTL_SECONDS`. Each key names the upstream and the client: its
credential's digest (`proxy.server.edge.credentials.credential_digest`, hashed again here), so
an id one client names is looked up only among the answers that client was given. Another client
can neither read the size of a chain it names by a stolen id nor write one for it: entries are
written only from the provider's own answers, under the credential of the request they answered.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from proxy.state.store import StateKey, StateStore

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
