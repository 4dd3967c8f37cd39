"""The `Authorization` header each upstream gets.

In order of preference:
1. a short-lived token: from Google's Application Default Credentials (`auth: adc`, refreshed
   before each expiry: `proxy.server.edge.adc`), or from a command (`gcloud auth print-access-token`
   for Vertex AI) or a file, fetched on first use and again every `token_refresh_seconds` (before
   Google's one-hour expiry);
2. an API key from the environment variable named by `api_key_env`, so clients never hold it;
3. the client's own `Authorization`, passed through, unless the proxy checks client keys of its
   own (then the client's header is the proxy's key and is never forwarded).

A token command or file that fails is the operator's business: the reason (which may name an
account or a credential path) goes to the log, and the client gets a generic 502. A token must be
one non-empty line of printable ASCII, or the refresh fails the same way.

The proxy's own client keys are accepted from `Authorization: Bearer`, `x-api-key`, `api-key` and
`x-goog-api-key` (where Google's SDKs put theirs),
and are stripped from every header and query parameter before anything is forwarded.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import shlex
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

from proxy.config.upstreams import UpstreamSettings
from proxy.errors import UpstreamUnavailable
from proxy.logging import get_logger
from proxy.providers.provider import OutgoingCall
from proxy.server.edge.adc import AdcError, AdcTokens

COMMAND_TIMEOUT_SECONDS = 30.0
SIGN_ON_LOOP_BYTES = 256 * 1024  # a call with a larger body is signed in a thread (0.8 ms for 1 MB on the loop)
CLIENT_KEY_HEADERS = ("x-api-key", "api-key", "x-goog-api-key")  # besides `Authorization: Bearer <key>`
_CREDENTIAL_HEADERS = ("Authorization", *CLIENT_KEY_HEADERS)


class TokenError(Exception):
    """Why a token could not be obtained: for the operator's log, never for a client."""


def presented_keys(headers: Mapping[str, str]) -> list[str]:
    """The client keys a request presents: its bearer token, `x-api-key` and `api-key`."""
    keys = []
    scheme, _, given = headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and given.strip():
        keys.append(given.strip())
    keys += [headers[name].strip() for name in CLIENT_KEY_HEADERS if headers.get(name, "").strip()]
    return keys


def credential_digest(headers: Mapping[str, str], query: Mapping[str, str] | None = None) -> bytes | None:
    """A digest of the first credential a request carries, None when it carries none: who the
    client is for its share of the threads and its part of the count cache
    (`proxy.server.threads.placement`). Read from the headers every client key is accepted from
    (`Authorization`, whatever its scheme, and `CLIENT_KEY_HEADERS`), else Google's `?key=`."""
    value = next((v for v in map(headers.get, _CREDENTIAL_HEADERS) if v), None)
    if not value and query:
        value = query.get("key")
    if value and value.startswith("AWS4-HMAC-SHA256 "):  # a SigV4 header signs each request anew: its key is who
        value = value.partition("/")[0]
    return hashlib.blake2b(value.encode("utf-8", "surrogateescape"), digest_size=16).digest() if value else None


def holds_client_key(headers: Mapping[str, str], keys: Iterable[str]) -> bool:
    """True when any key the request presents is one of `keys` (compared in constant time)."""
    allowed = [key.encode() for key in keys]
    return any(
        hmac.compare_digest(given.encode("utf-8", "surrogateescape"), key)
        for given in presented_keys(headers)
        for key in allowed
    )


def without_client_keys(query_string: str, keys: Iterable[str]) -> str:
    """`query_string`, as given, less every parameter whose value is one of the proxy's keys
    (`?api_key=`, `?key=` or any other name)."""
    secret = set(keys)
    if not secret or not query_string:
        return query_string
    kept = [p for p in query_string.split("&") if unquote_plus(p.partition("=")[2]).strip() not in secret]
    return "&".join(kept)


def without_parameter(query_string: str, name: str) -> str:
    """`query_string`, as given, less every `name=` parameter (a client's `?key=` where the guard
    injects the upstream's own credential)."""
    return "&".join(p for p in query_string.split("&") if unquote_plus(p.partition("=")[0]) != name)


def injects_credential(upstream: UpstreamSettings) -> bool:
    """Whether the guard sends `upstream` a credential of its own (a token from ADC, a command or a
    file, or a key it holds)."""
    return bool(upstream.token_command or upstream.token_file or upstream.api_key_env or upstream.auth)


# Headers that name a credential or the project a call is billed to: a client's never travel beside
# the operator's credential (Google's `x-goog-user-project` moves a call's quota and billing).
CLIENT_CREDENTIAL_HEADERS = frozenset({*CLIENT_KEY_HEADERS, "x-goog-user-project"})


def outside_project(upstream: UpstreamSettings, segments: tuple[str, ...], own: str | None = None) -> str | None:
    """Why a call to `upstream` on the path `segments` would use the operator's credential outside
    the project the config gives it, or None when it would not. The project and location come from
    the upstream's base URL (`.../v1/projects/{p}/locations/{l}/...`), else the project is the one
    the credential itself names (`own`: Application Default Credentials say theirs); with neither,
    the guard cannot tell the operator's project from another, and a path naming any is refused."""
    if not upstream.provider.google_native or not injects_credential(upstream):
        return None
    named = _scope(segments)
    if named is None:
        return None
    configured = _scope(tuple(s for s in upstream.base_url.split("://", 1)[-1].split("/")[1:] if s))
    if configured is None and own is not None:
        configured = (own, None)
    if configured is None:
        return (
            f"upstream {upstream.name!r} holds the operator's credential and its base_url names no project, so "
            "context-guard sends no path that names one; the operator can name the project and location in base_url"
        )
    if named[0] != configured[0]:
        return f"project {named[0][:64]!r} is not the project upstream {upstream.name!r} serves"
    if named[1] is not None and configured[1] is not None and named[1] != configured[1]:
        return f"location {named[1][:64]!r} is not the location upstream {upstream.name!r} serves"
    return None


def _scope(segments: tuple[str, ...]) -> tuple[str, str | None] | None:
    """The project and location a path names (`projects/{p}[/locations/{l}]`), or None."""
    for k, segment in enumerate(segments[:-1]):
        if segment == "projects":
            location = segments[k + 3] if k + 3 < len(segments) and segments[k + 2] == "locations" else None
            return segments[k + 1], location
    return None


def names_a_client_key(value: str, keys: Iterable[str]) -> bool:
    """True when a header value carries one of the proxy's keys (bare, or after a scheme)."""
    return any(key in value for key in keys)


class UpstreamAuth:
    def __init__(
        self,
        upstream: UpstreamSettings,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        log: Any = None,
    ) -> None:
        self.upstream = upstream
        self._env = os.environ if env is None else env
        self._clock = clock
        self._token: str | None = None
        self._fetched_at = 0.0
        self._lock = asyncio.Lock()
        self._log = log if log is not None else get_logger()
        self._adc = AdcTokens() if upstream.auth == "adc" else None
        self._keys = upstream.provider.signing_keys(upstream)  # a signing provider's (AWS SigV4), else None

    @property
    def project(self) -> str | None:
        """The Google project the guard's credential names of itself (ADC's, once it was read)."""
        return self._adc.project if self._adc is not None else None

    @property
    def uses_token(self) -> bool:
        return bool(self.upstream.token_command or self.upstream.token_file or self._adc)

    async def header(self, client_authorization: str | None, client_keys_in_use: bool) -> str | None:
        if self._adc is not None:  # it keeps its own token until shortly before the token expires
            return f"Bearer {await self._fetch()}"
        if self.uses_token:
            return f"Bearer {await self.token()}"
        name = self.upstream.api_key_env
        if name and self._env.get(name):
            return f"Bearer {self._env[name]}"
        return None if client_keys_in_use else client_authorization

    async def finished(self, call: OutgoingCall) -> OutgoingCall:
        """`call` made final by the upstream's provider (signed with the credentials it holds); the
        credentials are looked up or refreshed in a thread, one refresh at a time, when they are due."""
        keys = self._keys
        if keys is None:
            return self.upstream.provider.finish(call, None)
        try:
            if keys.due():
                async with self._lock:
                    current = await asyncio.to_thread(keys.current) if keys.due() else keys.current()
            else:
                current = keys.current()
        except Exception as exc:  # the provider's own errors (no credentials, a refresh that failed)
            # The exception's class only: a credential library's messages can name profiles and paths.
            self._log.error("signing_credentials_failed", upstream=self.upstream.name, reason=type(exc).__name__)
            raise UpstreamUnavailable(
                f"context-guard could not obtain credentials to sign for upstream {self.upstream.name!r}; "
                "the operator's log has the reason"
            ) from None
        if len(call.body) > SIGN_ON_LOOP_BYTES:  # a signature hashes the body: 7 ms for 10 MB, off the loop
            return await asyncio.to_thread(self.upstream.provider.finish, call, current)
        return self.upstream.provider.finish(call, current)

    async def token(self) -> str:
        if self._token is not None and self._clock() - self._fetched_at < self.upstream.token_refresh_seconds:
            return self._token
        async with self._lock:
            if self._token is None or self._clock() - self._fetched_at >= self.upstream.token_refresh_seconds:
                self._token = await self._fetch()
                self._fetched_at = self._clock()
            return self._token

    async def _fetch(self) -> str:
        try:
            return _one_line(await self._read_source())
        except TokenError as exc:
            self._log.error("token_refresh_failed", upstream=self.upstream.name, reason=str(exc))
            raise UpstreamUnavailable(
                f"context-guard could not obtain credentials for upstream {self.upstream.name!r}; "
                "the operator's log has the reason"
            ) from None

    async def _read_source(self) -> str:
        if self._adc is not None:
            try:
                return await self._adc.token()
            except AdcError as exc:
                raise TokenError(str(exc)) from None
        if self.upstream.token_command:
            return await self._run(self.upstream.token_command)
        source = self.upstream.token_file or ""
        try:
            return await asyncio.to_thread(Path(source).read_text, encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TokenError(f"token file {source!r} cannot be read: {exc}") from None

    @staticmethod
    async def _run(command: str) -> str:
        try:
            process = await asyncio.create_subprocess_exec(
                *shlex.split(command), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
            )
        except (OSError, ValueError) as exc:
            raise TokenError(f"token command cannot start: {exc}") from None
        try:
            out, err = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT_SECONDS)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise TokenError(f"token command timed out after {COMMAND_TIMEOUT_SECONDS:g} s") from None
        if process.returncode != 0:
            # The command's own message, not its output: output may be a partial secret.
            raise TokenError(
                f"token command exited with {process.returncode}: {err.decode(errors='replace').strip()[:200]}"
            )
        try:
            return out.decode()
        except UnicodeDecodeError:
            raise TokenError("token command printed bytes that are not UTF-8") from None


def _one_line(text: str) -> str:
    """The token in `text`: exactly one non-empty line of printable ASCII, without spaces."""
    lines = [line.strip() for line in text.strip().splitlines()]
    if not lines or not lines[0]:
        raise TokenError("the token is empty")
    if len(lines) > 1:
        raise TokenError(f"the token must be one line; got {len(lines)} lines")
    token = lines[0]
    if not token.isascii() or not token.isprintable() or " " in token:
        raise TokenError("the token holds spaces or characters that cannot go in an HTTP header")
    return token
