"""AWS Signature Version 4 for a `kind: bedrock` upstream with `auth: sigv4`: the guard's own AWS
credentials, found and refreshed as AWS's SDKs find them, sign each request after its body is final.

SigV4 signs a hash of the body, so a body the guard cut must be signed again, by the guard, with
credentials it holds; the client's own signature (or key) never crosses (`bedrock_headers`).
botocore is the standard signer and credential chain (environment keys, the shared config and
credentials files' profiles, SSO, container and EC2 instance roles). It is imported only when a
bedrock upstream signs. Finding the credentials may call a metadata server or a process: that runs
in a thread, once at start (`ready`), and again only when botocore says they are due for refresh,
one refresh at a time. Credentials are never logged, and botocore's own debug lines (which print
the canonical request, a session token included) are kept off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import MutableMapping
from typing import Any

from proxy.errors import UpstreamUnavailable
from proxy.logging import get_logger

SERVICE = "bedrock"  # bedrock-runtime signs as the `bedrock` service
SIGN_ON_LOOP_BYTES = 256 * 1024  # signing a larger body runs in a thread (0.8 ms for 1 MB on the loop)
# Of the forwarded headers, those that say what the body is and how Bedrock treats it are signed; the
# rest may be changed by the HTTP layer (hop-by-hop, lengths) and need not be.
_SIGNED = ("content-type", "accept")
_SIGNED_PREFIX = "x-amzn-bedrock-"
_CLIENT_AWS_PREFIX = "x-amz-"  # the client's date, session token and content hash: its signature's


class SigV4Signer:
    """Signs requests for one region with the credentials of the guard's environment."""

    def __init__(self, region: str, log: Any = None) -> None:
        self.region = region
        self._credentials: Any = None  # botocore's Credentials or RefreshableCredentials
        self._lock = asyncio.Lock()
        self._log = log if log is not None else get_logger()

    async def ready(self) -> bool:
        """Find the credentials (in a thread); whether any were found. At start, so the first
        request does not wait for a metadata server; a failure is logged, and tried again then."""
        try:
            await self._frozen()
        except UpstreamUnavailable:
            return False
        return True

    async def sign(self, method: str, url: str, headers: MutableMapping[str, str], body: bytes) -> None:
        """Add `Authorization`, `X-Amz-Date` (and `X-Amz-Security-Token`) to `headers` for this
        exact `method`, `url` (as sent, percent-encoded) and `body`."""
        from botocore.auth import SigV4Auth  # type: ignore[import-untyped]  # botocore ships no types
        from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]

        frozen = await self._frozen()
        signed = {name: value for name, value in headers.items() if _signs(name.lower())}
        request = AWSRequest(method=method, url=url, data=body, headers=signed)
        auth = SigV4Auth(frozen, SERVICE, self.region)
        if len(body) > SIGN_ON_LOOP_BYTES:  # the body's SHA-256 is the work: 7 ms for 10 MB, off the loop
            await asyncio.to_thread(auth.add_auth, request)
        else:
            auth.add_auth(request)
        for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
            if name in request.headers:
                headers[name] = request.headers[name]

    async def _frozen(self) -> Any:
        """Credentials as of now: botocore's refreshable ones are refreshed (in a thread) when due."""
        credentials = self._credentials
        if credentials is not None and not _due(credentials):
            return credentials.get_frozen_credentials()
        async with self._lock:
            try:
                if self._credentials is None:
                    self._credentials = await asyncio.to_thread(_find_credentials)
                return await asyncio.to_thread(self._credentials.get_frozen_credentials)
            except Exception as exc:  # botocore's own errors (no credentials, a refresh that failed)
                # The exception's class only: botocore's messages can name profiles and paths.
                self._log.error("aws_credentials_failed", region=self.region, reason=type(exc).__name__)
                raise UpstreamUnavailable(
                    "context-guard could not obtain AWS credentials to sign for its Bedrock upstream; "
                    "the operator's log has the reason"
                ) from None


def _signs(name: str) -> bool:
    return name in _SIGNED or name.startswith(_SIGNED_PREFIX)


def _due(credentials: Any) -> bool:
    refresh_needed = getattr(credentials, "refresh_needed", None)  # only refreshable credentials expire
    return bool(refresh_needed()) if refresh_needed is not None else False


def _find_credentials() -> Any:
    """botocore's default credential chain, as the AWS CLI and boto3 walk it."""
    import botocore.session  # type: ignore[import-untyped]  # botocore ships no types

    logging.getLogger("botocore").setLevel(max(logging.getLogger("botocore").level, logging.INFO))
    credentials = botocore.session.get_session().get_credentials()
    if credentials is None:
        raise LookupError("no AWS credentials in the environment, profiles or instance roles")
    return credentials


def bedrock_headers(headers: MutableMapping[str, str]) -> None:
    """A client's own AWS signing headers (`X-Amz-Date`, `X-Amz-Security-Token`,
    `X-Amz-Content-Sha256`, ...) never cross to Bedrock: the guard's credential stands alone."""
    for name in {name for name in headers if name.lower().startswith(_CLIENT_AWS_PREFIX)}:
        if name in headers:
            del headers[name]


async def bedrock_request(
    signer: SigV4Signer | None, method: str, url: str, headers: MutableMapping[str, str], body: bytes
) -> None:
    """The headers of a request to a Bedrock upstream, made final: the client's AWS headers
    dropped, then (with `auth: sigv4`) the whole request signed as it will be sent."""
    bedrock_headers(headers)
    if signer is not None:
        await signer.sign(method, url, headers, body)
