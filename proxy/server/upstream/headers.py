"""The headers that cross, both ways.

Hop-by-hop headers, every header named in `Connection` or `Proxy-Connection`, and (outgoing) any
header carrying the proxy's own client key never cross. The request body is always sent decoded
(`proxy.server.edge.body`), so `Content-Encoding` does not cross either; the upstream's own
credential replaces the client's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from multidict import CIMultiDict, CIMultiDictProxy

from proxy.apis.anthropic.context_edits import without_beta
from proxy.config.upstreams import UpstreamSettings
from proxy.server.edge.credentials import CLIENT_CREDENTIAL_HEADERS, injects_credential, names_a_client_key
from proxy.server.observation.record import REPORT_PREFIX  # the guard's own headers never leave it

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "proxy-connection",
    }
)


# The body sent upstream is always the decoded one (`proxy.server.edge.body`).
REQUEST_ONLY_DROPPED = frozenset({"content-encoding"})


def connection_named(headers: Mapping[str, str]) -> frozenset[str]:
    """The header names listed in `Connection` and `Proxy-Connection`: hop-by-hop by declaration."""
    if isinstance(headers, CIMultiDictProxy | CIMultiDict):  # a request's or response's: looked up, not scanned
        values = [*headers.getall("connection", ()), *headers.getall("proxy-connection", ())]
    else:
        values = [value for name, value in headers.items() if name.lower() in ("connection", "proxy-connection")]
    if not values:
        return _NONE_NAMED
    return frozenset(token.strip().lower() for value in values for token in value.split(",") if token.strip())


_NONE_NAMED: frozenset[str] = frozenset()


_REQUEST_DROPPED = HOP_BY_HOP | REQUEST_ONLY_DROPPED | {"authorization"}  # the upstream's own credential goes


def request_headers(
    client: Mapping[str, str],
    upstream: UpstreamSettings,
    authorization: str | None,
    client_keys: Iterable[str] = (),
) -> CIMultiDict[str]:
    keys = tuple(client_keys)
    named = connection_named(client)
    dropped = _REQUEST_DROPPED | named if named else _REQUEST_DROPPED
    if injects_credential(upstream) and authorization is not None and authorization != client.get("Authorization"):
        dropped = dropped | CLIENT_CREDENTIAL_HEADERS  # the operator's: no key or project of the client's beside it
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in client.items():
        lower = name.lower()
        if lower in dropped or lower.startswith(REPORT_PREFIX) or (keys and names_a_client_key(value, keys)):
            continue
        headers.add(name, value)
    for name, value in upstream.headers.items():
        headers[name] = value
    provider = upstream.provider
    key_header = provider.key_header
    injected_key = upstream.api_key_env and not (upstream.token_command or upstream.token_file or upstream.auth)
    if authorization and key_header and injected_key and authorization.startswith("Bearer "):
        # Anthropic, Azure and Google take an API key in a header of their own, not as a bearer token.
        headers.popall(key_header, None)
        headers[key_header] = authorization.removeprefix("Bearer ")
    elif authorization:
        headers["Authorization"] = authorization
    for name, value in provider.default_headers.items():  # Anthropic's `anthropic-version`, when the client named none
        headers.setdefault(name, value)
    if upstream.edits_by_guard and "anthropic-beta" in headers:  # the guard applies the edits, not the upstream
        betas = without_beta(",".join(headers.popall("anthropic-beta")))
        if betas:
            headers["anthropic-beta"] = betas
    return headers


def response_headers(upstream: Mapping[str, str]) -> CIMultiDict[str]:
    """The upstream's headers less hop-by-hop ones. Its own request id (OpenAI's, for support
    tickets) is kept as `x-upstream-request-id`: `x-request-id` is the proxy's."""
    named = connection_named(upstream)
    dropped = HOP_BY_HOP | named if named else HOP_BY_HOP
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.items():
        lower = name.lower()
        if lower == "x-request-id":
            headers["x-upstream-request-id"] = value
        elif lower not in dropped:
            headers.add(name, value)
    return headers
