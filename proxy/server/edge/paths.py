"""One canonical path per request: it alone decides the route and the upstream URL.

A path can be spelled many ways (`/v1/chat/./completions`, `/v1//chat/completions/`,
`/v1/chat/complet%69ons`); if the router matched one spelling while the upstream, after its own
normalisation, saw another, a chat request could slip past the count through pass-through. So the
raw path is read once, here:

- percent-escapes are decoded exactly once, and must decode to UTF-8;
- duplicate slashes collapse, a trailing slash goes, `.` segments vanish and `..` removes the
  segment before it;
- anything still ambiguous is refused with 400: an encoded `/`, `?`, `#` or `\\` (a segment
  separator to some servers and not to others), a raw `\\`, a control character or NUL, a `%`
  left after decoding (decoded again by some servers), and `..` that would climb above the root.

A shape whose paths hold what these rules refuse says how it reads them (`Shape.reads_path`:
Bedrock's model ids, an ARN's encoded `/` inside one segment); its reading decides those paths.

The result, `CanonicalPath`, is matched against the API adapters' paths (`proxy.apis.registry`:
every counted path and the shape it speaks), the local paths (`proxy.server.edge.local_paths`,
answered here), and the pass-through policy; and it builds the upstream URL, which always stays
under the upstream's base path. Nothing downstream looks at the raw path again. A forwarded path is checked once more
against where it lands (`counted_when_sent`): no spelling reaches a counted endpoint uncounted.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple
from urllib.parse import quote

from aiohttp import web
from yarl import URL

from proxy.apis.gemini.generate_content import gemini_error
from proxy.apis.gemini.google_paths import generation_method, google_path, is_google_shaped
from proxy.apis.registry import Endpoint, endpoint_api, shape_path
from proxy.errors import BadRequest, GuardError, MethodNotAllowed, PathNotFound

API_PREFIX = "/v1"  # the client-facing API version; the upstream's base URL carries its own

GUARDED_METHODS = frozenset({"POST"})  # on every spelling of a counted path
LOCAL_METHODS = frozenset({"GET", "HEAD"})

# Characters an escape may not produce: each changes how the path splits, or ends it.
_AMBIGUOUS_DECODED = {"/": "an encoded '/'", "?": "an encoded '?'", "#": "an encoded '#'", "\\": "an encoded '\\'"}
_ESCAPE = re.compile(rb"%([0-9A-Fa-f]{2})")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Characters kept as they are in an outgoing segment (RFC 3986 pchar less '%'); the rest is escaped.
_SEGMENT_SAFE = "!$&'()*+,;=:@-._~"


class InvalidPath(BadRequest):
    code = "invalid_path"


class CanonicalPath(NamedTuple):
    """A request path with one spelling: decoded, `/`-joined segments, no dot segments, no empty
    segments; the root is `/`. A named tuple, not a dataclass: it keys the cache of upstream URLs
    (`upstream_url`) on every request, hashed at C speed."""

    value: str

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(s for s in self.value.split("/") if s)

    def is_under(self, prefix: str) -> bool:
        """True for `prefix` itself and every path below it, matched segment by segment."""
        own, theirs = self.segments, CanonicalPath(prefix).segments
        return own[: len(theirs)] == theirs

    def api_relative(self) -> tuple[str, ...]:
        """The segments after the client-facing `/v1`, which the upstream's base URL replaces."""
        return self.segments[1:] if self.is_under(API_PREFIX) else self.segments

    def __str__(self) -> str:
        return self.value


@functools.lru_cache(maxsize=1024)
def canonical_path(raw: str) -> CanonicalPath:
    """The canonical form of `raw`, the path as it came in the request line (still percent-encoded,
    no query), or InvalidPath saying why it is ambiguous. Kept for the paths that recur (a
    `CanonicalPath` is immutable; a refusal is not kept, it is worked out again)."""
    if "#" in raw or "?" in raw:
        raise InvalidPath("the request path holds a '#' or '?' where none can be")
    try:  # a shape's own spelling first (Bedrock's model ids: an ARN's encoded '/' in one segment)
        own = shape_path(raw)
    except ValueError as exc:
        raise InvalidPath(str(exc)) from None
    if own is not None:
        return CanonicalPath(own)
    if "\\" in raw:
        raise InvalidPath("the request path holds a '\\', which servers read differently")
    for match in _ESCAPE.finditer(raw.encode("utf-8", "surrogatepass")):
        what = _AMBIGUOUS_DECODED.get(chr(int(match.group(1), 16)))
        if what is not None:
            escape = match.group(0).decode()
            raise InvalidPath(f"the request path holds {what} ({escape}), which servers read differently")
    decoded = _decode_once(raw)
    if _CONTROL.search(decoded):
        raise InvalidPath("the request path holds a control character")
    if "%" in decoded:
        raise InvalidPath("the request path is percent-encoded twice ('%' after decoding)")
    segments: list[str] = []
    for segment in decoded.split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if not segments:
                raise InvalidPath("the request path climbs above the root ('..')")
            segments.pop()
            continue
        segments.append(segment)
    return CanonicalPath("/" + "/".join(segments))


def _decode_once(raw: str) -> str:
    if "%" not in raw:
        return raw
    data = raw.encode("utf-8", "surrogatepass")
    if data.count(b"%") != len(_ESCAPE.findall(data)):
        raise InvalidPath("the request path holds a '%' that is not a valid escape")
    try:
        return _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), data).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidPath("the request path does not decode to UTF-8") from None


@dataclass(frozen=True)
class PassthroughPolicy:
    """Which paths, other than the guarded ones, are forwarded upstream: `all`, `none`, or those
    under any of `prefixes` (the default: the OpenAI API surface, `/v1` and below)."""

    mode: Literal["all", "none", "prefixes"] = "prefixes"
    prefixes: tuple[str, ...] = (API_PREFIX,)

    def __post_init__(self) -> None:
        if self.mode not in ("all", "none", "prefixes"):
            raise ValueError(f"passthrough must be all, none or a list of path prefixes, not {self.mode!r}")
        for prefix in self.prefixes:
            if not isinstance(prefix, str) or not prefix.startswith("/"):
                raise ValueError(f"passthrough prefix {prefix!r} must be a path starting with '/'")
            try:
                canonical = canonical_path(prefix)
            except InvalidPath as exc:
                raise ValueError(f"passthrough prefix {prefix!r}: {exc.message}") from None
            if canonical.value != prefix.rstrip("/") and prefix != "/":
                raise ValueError(f"passthrough prefix {prefix!r} must be written canonically, as {canonical}")

    @classmethod
    def parse(cls, value: object) -> PassthroughPolicy:
        """From the YAML value: `all`, `none`, or a list of prefixes such as `[/v1]`."""
        if value in ("all", "none"):
            return cls(value, ())
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return cls("prefixes", tuple(value))
        raise ValueError(f"passthrough must be all, none or a list of path prefixes, not {value!r}")

    def allows(self, path: CanonicalPath) -> bool:
        if self.mode == "all":
            return True
        return self.mode == "prefixes" and any(path.is_under(prefix) for prefix in self.prefixes)


RouteKind = Literal["guarded", "local", "forward"]


@dataclass(frozen=True, slots=True)
class PathRoute:
    """What a request is, by its canonical path: counted (`api` names its shape), answered here
    (`api` names the local endpoint), or forwarded as it is."""

    kind: RouteKind
    path: CanonicalPath
    api: str | None = None
    endpoint: Endpoint | None = None  # for a counted path: its adapter, and the model the path names
    # The path's segments, split once with the route (which is kept per path), not on every request:
    # what the upstream's URL is made of where the path goes to the host's root as written (Google's).
    segments: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "segments", self.path.segments)


PASSTHROUGH = web.AppKey("passthrough", PassthroughPolicy)
PATH_ROUTE = web.RequestKey("path_route", PathRoute)  # set by the app's canonical-path middleware


def route_for(
    path: CanonicalPath,
    method: str,
    policy: PassthroughPolicy,
    guarded: Callable[[str], Endpoint | None],
    local: Callable[[str], str | None],
) -> PathRoute:
    """The route for `path`; 405 for a method the path does not take, 404 for a path that is
    neither counted (`guarded(path)` gives its endpoint), answered here (`local(path)` names it:
    `proxy.server.edge.local_paths.local_name`), nor allowed through. A path that asks a model to
    generate in a way no adapter counts (`:batchGenerateContent`, `:predict`, `:GenerateContent`,
    `/v1/v1beta/...:generateContent`) is refused whatever the policy; Google's own paths (a
    version only Google uses, a resource only Google has) are forwarded unless the policy is
    `none`, and then only those on Google's allow-list (`proxy.apis.gemini.google_paths`)."""
    if (endpoint := guarded(path.value)) is not None:
        _check_method(method, GUARDED_METHODS, path)
        return PathRoute("guarded", path, endpoint_api(endpoint), endpoint)
    if (name := local(path.value)) is not None:
        _check_method(method, LOCAL_METHODS, path)
        return PathRoute("local", path, name)
    if (generating := generation_method(path.segments)) is not None:
        raise PathNotFound(
            f"context-guard does not forward {path.value}: :{generating} runs a model in a way the guard does "
            "not count; use :generateContent or :streamGenerateContent on the model's own path"
        )
    google = google_path(path.segments)
    if policy.mode != "none" and google is not None and google.google_only:
        return PathRoute("forward", path)
    if policy.allows(path):
        return PathRoute("forward", path)
    raise PathNotFound(f"context-guard does not serve or forward {path.value}")


def error_body(error: GuardError, path: str) -> dict[str, Any]:
    """`error` in the shape a client of `path` reads, for a path no adapter speaks: Google's
    (`{"error": {"code", "message", "status"}}`) on Google's own paths, OpenAI's elsewhere."""
    if is_google_shaped(CanonicalPath(path).segments):
        return gemini_error(error.status, error.message)
    return error.to_openai()


def _check_method(method: str, allowed: frozenset[str], path: CanonicalPath) -> None:
    if method not in allowed:
        raise MethodNotAllowed(
            f"{method} is not allowed on {path.value}; use {' or '.join(sorted(allowed))}",
            headers={"Allow": ", ".join(sorted(allowed))},
        )


@functools.lru_cache(maxsize=1024)
def upstream_url(base_url: str, path: CanonicalPath, query_string: str = "") -> URL:
    """The upstream URL for `path`: the upstream's base URL (e.g. `https://api.openai.com/v1`)
    followed by the path's segments after the client-facing `/v1`, each percent-encoded, with the
    query string as given. Built pre-encoded so that the HTTP client does not normalise it again;
    the canonical path has no dot segments, so the result stays under the base path.
    Built once per base, path and query (a `URL` is immutable): the same few recur on every request."""
    base = URL(base_url)
    tail = "".join("/" + quote(segment, safe=_SEGMENT_SAFE) for segment in path.api_relative())
    return URL.build(
        scheme=base.scheme,
        user=base.raw_user,
        password=base.raw_password,
        host=base.raw_host or "",
        port=base.explicit_port,
        path=base.raw_path.rstrip("/") + tail,
        query_string=query_string,
        encoded=True,
    )


@functools.lru_cache(maxsize=1024)
def host_root_url(base_url: str, segments: tuple[str, ...], query_string: str = "") -> URL:
    """The upstream URL of a path that carries its own version and project (Gemini's, Vertex AI's
    native ones): the base URL's scheme, host and port, then `segments` whole, each percent-encoded.
    The base's own path (`/v1/projects/p/locations/l/endpoints/openapi`, Vertex AI's OpenAI-compatible
    endpoint) is not kept: Google serves these paths from the host's root."""
    base = URL(base_url)
    return URL.build(
        scheme=base.scheme,
        host=base.raw_host or "",
        port=base.explicit_port,
        path="".join("/" + quote(segment, safe=_SEGMENT_SAFE) for segment in segments),
        query_string=query_string,
        encoded=True,
    )


def counted_when_sent(base_url: str, path: CanonicalPath, guarded: Callable[[str], str | None]) -> str | None:
    """The path a forwarded request reaches under `base_url`, when the guard counts that path
    (`guarded` names its API shape); None otherwise. The client-facing `/v1` is swapped for the
    base path, so a base URL that stops short of its API's root lets a longer spelling land on a
    counted endpoint: with Azure's base at the host, `/v1/openai/deployments/d/chat/completions`
    would reach `/openai/deployments/d/chat/completions`, and with a base of `http://host`,
    `/v1/v1/chat/completions` would reach `/v1/chat/completions`. Pass-through refuses those."""
    try:
        sent = canonical_path(upstream_url(base_url, path).raw_path)
    except InvalidPath:  # a base path of the operator's that reads ambiguously: not one of ours
        return None
    return sent.value if guarded(sent.value) is not None else None
