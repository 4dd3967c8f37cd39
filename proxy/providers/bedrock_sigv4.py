"""AWS Signature Version 4 for a `kind: bedrock` upstream with `auth: sigv4`: the guard's own AWS
credentials, found and refreshed as AWS's SDKs find them, sign each call once its body is final.

SigV4 signs a hash of the body, so a body the guard cut must be signed again, by the guard, with
credentials it holds; the client's own signature (or key) never crosses. botocore is the standard
signer and credential chain (environment keys, the shared config and credentials files' profiles,
SSO, container and EC2 instance roles); it is imported only when a bedrock upstream signs.
Finding the credentials may call a metadata server or a process: `AwsKeys.current` does that, and
the server calls it in a thread when `due` says so (the first look, or a refresh botocore says
is due; `proxy.server.edge.credentials.UpstreamAuth.finished`). Signing with the frozen
credentials is pure. Credentials are never logged, and botocore's own debug lines (which print the
canonical request, a session token included) are kept off.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

SERVICE = "bedrock"  # bedrock-runtime signs as the `bedrock` service
# Of the forwarded headers, those that say what the body is and how Bedrock treats it are signed; the
# rest may be changed by the HTTP layer (hop-by-hop, lengths) and need not be.
_SIGNED = ("content-type", "accept")
_SIGNED_PREFIX = "x-amzn-bedrock-"
_CLIENT_AWS_PREFIX = "x-amz-"  # the client's date, session token and content hash: its signature's


class AwsKeys:
    """The AWS credentials of the guard's environment, for one upstream and the region it signs
    for (`SigningKeys`)."""

    def __init__(self, region: str) -> None:
        self.region = region
        self._credentials: Any = None  # botocore's Credentials or RefreshableCredentials

    def due(self) -> bool:
        """Whether `current` may block: nothing found yet, or refreshable credentials due for refresh."""
        credentials = self._credentials
        if credentials is None:
            return True
        refresh_needed = getattr(credentials, "refresh_needed", None)  # only refreshable credentials expire
        return bool(refresh_needed()) if refresh_needed is not None else False

    def current(self) -> tuple[object, str]:
        """The frozen credentials as of now (botocore's refreshable ones refreshed when due), and the region."""
        if self._credentials is None:
            self._credentials = _find_credentials()
        return self._credentials.get_frozen_credentials(), self.region


def _find_credentials() -> Any:
    """botocore's default credential chain, as the AWS CLI and boto3 walk it."""
    import botocore.session  # type: ignore[import-untyped]  # botocore ships no types

    logging.getLogger("botocore").setLevel(max(logging.getLogger("botocore").level, logging.INFO))
    credentials = botocore.session.get_session().get_credentials()
    if credentials is None:
        raise LookupError("no AWS credentials in the environment, profiles or instance roles")
    return credentials


def without_client_signing(headers: Mapping[str, str]) -> dict[str, str]:
    """`headers` less a client's own AWS signing headers (`X-Amz-Date`, `X-Amz-Security-Token`,
    `X-Amz-Content-Sha256`, ...): the guard's credential stands alone."""
    return {name: value for name, value in headers.items() if not name.lower().startswith(_CLIENT_AWS_PREFIX)}


def signed_headers(
    method: str, url: str, headers: Mapping[str, str], body: bytes, signing: tuple[object, str]
) -> dict[str, str]:
    """`headers` with `Authorization`, `X-Amz-Date` (and `X-Amz-Security-Token`) for this exact
    `method`, `url` (as sent, percent-encoded) and `body`; `signing`: the frozen credentials and
    the region."""
    from botocore.auth import SigV4Auth  # type: ignore[import-untyped]  # botocore ships no types
    from botocore.awsrequest import AWSRequest  # type: ignore[import-untyped]

    frozen, region = signing
    signed = {name: value for name, value in headers.items() if _signs(name.lower())}
    request = AWSRequest(method=method, url=url, data=body, headers=signed)
    SigV4Auth(frozen, SERVICE, region).add_auth(request)
    out = {name: value for name, value in headers.items() if name.lower() != "authorization"}
    for name in ("Authorization", "X-Amz-Date", "X-Amz-Security-Token"):
        if name in request.headers:
            out[name] = request.headers[name]
    return out


def _signs(name: str) -> bool:
    return name in _SIGNED or name.startswith(_SIGNED_PREFIX)
