"""Which client a request comes from, as far as the guard's shared state must tell clients apart.

The count cache is kept per client (`proxy.core.tokenizer.ScopedCountCache`), so that the time a
request takes cannot tell one client whether another sent a text. A client is its credential (a
digest of the first key it presents: `Authorization`, `x-api-key`, `api-key`), else the connection
it came on. One digest of a short header per request, never of the body.
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable

from aiohttp import web

_CREDENTIAL_HEADERS = ("Authorization", "x-api-key", "api-key")


def client_scope(request: web.Request) -> Hashable:
    """The scope of `request`'s client: ("key", digest of its credential) or ("connection", peer)."""
    headers = request.headers
    for name in _CREDENTIAL_HEADERS:
        value = headers.get(name)
        if value:
            return ("key", hashlib.blake2b(value.encode("utf-8", "surrogateescape"), digest_size=16).digest())
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return ("connection", str(peer), id(transport))
