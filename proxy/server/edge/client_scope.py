"""Which client a request comes from, as far as the guard's shared state must tell clients apart.

One home for the client's identity, used twice:
- the count cache is kept per client (`proxy.core.counting.count_cache.ScopedCountCache`), so that the time a
  request takes cannot tell one client whether another sent a text: a client is its credential,
  else the connection it came on (`client_scope`);
- the threads that count large bodies are shared fairly per client (`proxy.server.threads.slots`): a client
  is its credential, else its peer's address, so that opening more connections buys no more share.
The credential is `proxy.server.edge.credentials.credential_digest`: one digest of a short header per
request, never of the body.
"""

from __future__ import annotations

from collections.abc import Hashable

from aiohttp import web


def client_scope(request: web.Request, digest: bytes | None) -> Hashable:
    """The scope of `request`'s client: ("key", `digest`, its credential's: `credential_digest`)
    or ("connection", peer)."""
    if digest is not None:
        return ("key", digest)
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return ("connection", str(peer), id(transport))
