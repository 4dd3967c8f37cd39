"""Which client a request comes from, as far as the guard's shared state must tell clients apart.

One home for the client's identity, used twice:
- the count cache is kept per client (`proxy.core.count_cache.ScopedCountCache`), so that the time a
  request takes cannot tell one client whether another sent a text: a client is its credential,
  else the connection it came on (`client_scope`);
- the threads that count large bodies are shared fairly per client (`proxy.server.slots`): a client
  is its credential, else its peer's address, so that opening more connections buys no more share.
The credential is a digest of the first key the request presents (`Authorization`, `x-api-key`,
`api-key`): one digest of a short header per request, never of the body.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Mapping

from aiohttp import web

_CREDENTIAL_HEADERS = ("Authorization", "x-api-key", "api-key")


def credential_digest(headers: Mapping[str, str]) -> bytes | None:
    """A digest of the first credential `headers` carry, None when they carry none."""
    for name in _CREDENTIAL_HEADERS:
        value = headers.get(name)
        if value:
            return hashlib.blake2b(value.encode("utf-8", "surrogateescape"), digest_size=16).digest()
    return None


def client_scope(request: web.Request, digest: bytes | None) -> Hashable:
    """The scope of `request`'s client: ("key", `digest`, its credential's: `credential_digest`)
    or ("connection", peer)."""
    if digest is not None:
        return ("key", digest)
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return ("connection", str(peer), id(transport))
