"""Bounds on the names a client writes and the guard keys on.

A model name picks a profile, a route, a mode, the key learned state is kept under, a metrics
label and a row of the recent-decisions page; an Azure deployment or a Vertex AI model in the
path does the same. No provider's model names come near `MAX_NAME_CHARS`; a longer one is refused
before anything keys on it (the log, the page and the caches then never hold one).
"""

from __future__ import annotations

from proxy.apis.base import InvalidRequest

MAX_NAME_CHARS = 256


def bounded_name(name: str, param: str) -> str:
    """`name` when it is at most `MAX_NAME_CHARS` characters; else InvalidRequest naming `param`."""
    if len(name) > MAX_NAME_CHARS:
        raise InvalidRequest(f"'{param}' must be at most {MAX_NAME_CHARS} characters, not {len(name):,}", param=param)
    return name
