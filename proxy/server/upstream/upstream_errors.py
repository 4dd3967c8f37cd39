"""An upstream's failures, read in one place.

aiohttp's errors are translated by `upstream_errors()`: refused or reset connections become
`UpstreamUnavailable` (502), timeouts `UpstreamTimeout` (504). An error body is read bounded, and
inflated bounded, for its message; an overflow error without numbers gets the guard's count added
to its message (`with_guard_count`)."""

from __future__ import annotations

import functools
import json

import aiohttp

from proxy.config.upstreams import UpstreamSettings
from proxy.core.learning.corrections import Overflow
from proxy.core.plan import Plan
from proxy.errors import GuardError, UpstreamTimeout, UpstreamUnavailable
from proxy.server.edge.body import decoded as decoded_within

MAX_ERROR_BODY = 1024 * 1024


# What an error body is read as, inflated, at most: its message is near the start, and 1 MiB of
# compressed bytes could otherwise inflate to a gigabyte.
MAX_DECODED_ERROR_BODY = 4 * MAX_ERROR_BODY


def upstream_failure(upstream: UpstreamSettings, exc: BaseException) -> GuardError | None:
    """aiohttp's failure `exc` as the proxy's own error; None for every other exception."""
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamTimeout(f"upstream {upstream.name!r} did not answer in time")
    if isinstance(exc, aiohttp.ClientResponseError):
        return UpstreamUnavailable(f"upstream {upstream.name!r} sent a malformed response: {exc.message}")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return UpstreamUnavailable(f"upstream {upstream.name!r} is unreachable ({type(exc).__name__})")
    return None


class upstream_errors:  # used as a function: `with upstream_errors(upstream):`
    """aiohttp's failures as the proxy's own errors; every other exception passes through.
    A class rather than a generator-based context manager: it wraps every upstream call."""

    __slots__ = ("upstream",)

    def __init__(self, upstream: UpstreamSettings) -> None:
        self.upstream = upstream

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, Exception):  # anything else goes on as it was (None: not swallowed)
            error = upstream_failure(self.upstream, exc)
            if error is not None:
                raise error from exc


@functools.lru_cache(maxsize=64)
def client_timeout(connect: float | None, read: float | None) -> aiohttp.ClientTimeout:
    """An upstream's deadlines (`connect_timeout`, `read_timeout`), built once per pair: frozen, shared."""
    return aiohttp.ClientTimeout(total=None, connect=connect, sock_read=read)


async def read_error_body(upstream: UpstreamSettings, response: aiohttp.ClientResponse) -> bytes:
    with upstream_errors(upstream):
        return await response.content.read(MAX_ERROR_BODY)


def decoded(body: bytes, content_encoding: str | None) -> bytes:
    """`body` without its gzip or deflate encoding, for reading an error, not for relaying it:
    clients (the openai SDK among them) ask for compressed responses, and the proxy relays bytes
    as they come. Anything it cannot decode comes back as it was; at most `MAX_DECODED_ERROR_BODY`
    bytes of it are inflated."""
    return decoded_within(body, content_encoding, MAX_DECODED_ERROR_BODY)


def overflow_told(error_body: bytes, overflow: Overflow | None, plan: Plan | None) -> bytes | None:
    """An overflow error the provider gave without its count (OpenAI Responses' "Your input exceeds
    the context window of this model"), with the guard's own count of `plan` said after its
    message: the body as JSON again, every other field kept; None when there is nothing to add
    (another error, a count given, no plan, no message to add to)."""
    if overflow is None or overflow.prompt_tokens is not None or plan is None:
        return None
    result = plan.result
    tokens, budget, window = result.tokens_after, result.budget.input_budget, result.budget.context_window
    try:
        data = json.loads(error_body)
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(error, dict) or not isinstance(message, str):
        return None
    said = f" (context-guard counted {tokens:,} input tokens; its input budget is {budget:,}"
    said += f" of a {window:,}-token window)"
    return json.dumps({**data, "error": {**error, "message": message + said}}).encode()


def json_message(body: bytes) -> str:
    """The message of an OpenAI-shaped error body, for the guard's own error saying what came."""
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return "an answer the guard cannot read"
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else "an answer the guard cannot read"
