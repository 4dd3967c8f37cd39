"""`Provider`: everything specific to one kind of upstream, with the defaults most kinds share.

An upstream's settings say where it is and how it authenticates; its kind says what it is. The
server resolves the kind's provider once (`proxy.providers.kinds.provider_for`, at settings
build) and afterwards only asks it: which API shapes it serves, which header carries the
operator's key, what its count endpoint is for a shape, what context it holds and how big, how
its paths are laid out, how it behaves as a backend. No code outside this package compares an
upstream's kind with a name (`tests/test_layering.py` checks the core and the server). A new kind
is a module here and one line in `proxy.providers.kinds.PROVIDERS`.

A provider is pure: it builds calls (`CountCall`, `OutgoingCall`) and reads answers; sending them
is the server's (`proxy.server.upstream`). A provider that signs its requests (AWS SigV4 signs a
hash of the body, so a body the guard cut is signed again) says `signs`; then `finish` is the last
word on every outgoing call (the forwarded request, a count call at the budget's edge), given the
credentials its `signing_keys` hold. Finding and refreshing those may block (a metadata server, a
process): the server does it, in a thread, only when they say they are `due`
(`proxy.server.edge.credentials.UpstreamAuth.finished`); signing with them is pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

from proxy.core.counting.edge import CountCall
from proxy.core.models.model_registry import TokenizerSpec
from proxy.core.models.opt_in_windows import OptIn

# OpenAI's encodings: what a kind whose models the settings cannot tell may be asked to count with.
OPENAI_VOCABULARIES = (TokenizerSpec("tiktoken", "o200k_base"), TokenizerSpec("tiktoken", "cl100k_base"))


@dataclass(frozen=True, slots=True)
class BackendProfile:
    """How a kind of server behaves as a backend (`proxy.server.backends.profiles`)."""

    kind: str
    output_must_fit: bool  # prompt + max_tokens must fit the window; False: only the prompt must
    usage_in_streams: bool  # honours `stream_options.include_usage`
    overflow_texts: tuple[str, ...]  # phrases of its context-overflow errors
    signals_overflow: bool = True  # False: it truncates silently, so the guard must never be late
    empty_stream_on_overflow: bool = False  # an over-window stream is a 200 with an empty body
    request_id_must_be_uuid: bool = False  # any other `x-request-id` is refused with an empty 400
    window_per_model: bool = False  # states a model's window only when asked about that model (Ollama)
    named_in_corrections: bool = True  # a learned correction names it (not a server nothing is known of)


class SettingsRefused(ValueError):
    """Settings of an upstream its provider cannot work with; `key` names the setting."""

    def __init__(self, message: str, key: str) -> None:
        super().__init__(message)
        self.key = key


class SigningKeys(Protocol):
    """The credentials a signing provider signs with, as the server keeps them for one upstream."""

    def due(self) -> bool:
        """Whether `current` may block (the first look, or a refresh that is due)."""
        ...

    def current(self) -> object:
        """The credentials as of now (the server calls it in a thread when `due`)."""
        ...


@dataclass(frozen=True, slots=True)
class OutgoingCall:
    """One request the guard is about to send upstream, as `Provider.finish` sees it: what it may
    change (the headers, to sign the call) and what a signature covers (method, URL, body bytes)."""

    method: str
    url: str
    headers: Mapping[str, str]
    body: bytes


class Provider:
    """An upstream kind. Subclasses set what differs; the defaults describe a generic
    OpenAI-compatible server that is asked nothing and counts nothing itself."""

    kind: ClassVar[str] = ""  # the configured name (`upstreams.<name>.kind`), for messages and docs
    shapes: ClassVar[tuple[str, ...]] = ()  # the API shapes it serves when `apis` is not configured
    # How it behaves as a backend (`proxy.server.backends.profiles`): must prompt + max_tokens fit,
    # usage in streams, the words of its overflow errors.
    backend_kind: ClassVar[str] = "generic"
    # Its behaviour as a backend, for a kind that is one (`backend_kind` names the kind whose
    # profile applies: Azure's and Anthropic's is OpenAI's, Gemini's Vertex AI's).
    backend: ClassVar[BackendProfile | None] = None
    discovered: ClassVar[bool] = False  # asked at start what it is (its window, whether it tokenizes)
    key_header: ClassVar[str | None] = None  # where an operator's key goes; None: `Authorization: Bearer`
    chat_at_base_url: ClassVar[bool] = True  # serves chat completions at `{base_url}/chat/completions`
    # Sent when the client named none (Anthropic's `anthropic-version`).
    default_headers: ClassVar[Mapping[str, str]] = {}
    edits_context: ClassVar[bool] = False  # applies Anthropic's context edits itself
    # Serves Google's own native API: a path of it is sent at the host's root under Google's
    # allow-list, and the operator's credential stays in the project its base URL names.
    google_native: ClassVar[bool] = False
    opt_ins: ClassVar[tuple[OptIn, ...]] = ()  # the larger windows a request header opts into here
    # The held context (`proxy.apis.base.HeldContext.kind`) its count endpoint counts with the
    # request itself (OpenAI's `/responses/input_tokens` reads a stored response or conversation).
    counts_held_with_request: ClassVar[frozenset[str]] = frozenset()
    # The provider a learned correction names, whatever backend it behaves as (None: the backend's).
    corrections_name: ClassVar[str | None] = None
    count_endpoint: ClassVar[bool] = False  # it has a count endpoint (`count_call`) for some shape
    signs: ClassVar[bool] = False  # `finish` must see every outgoing call, its body final
    # A path no shape counts may be forwarded to it (False: its calls are signed with the guard's
    # credentials, so a forwarded one would run a model uncounted: Bedrock's StartAsyncInvoke).
    forwards_uncounted: ClassVar[bool] = True
    # What `tokenizers.preload: auto` loads before the process is ready for an upstream of this
    # kind (`proxy.tokenizers.at_start`): the vocabularies its models are counted with.
    vocabularies_at_start: ClassVar[tuple[TokenizerSpec, ...]] = OPENAI_VOCABULARIES

    def check(self, upstream: Any) -> None:
        """Refuse settings of `upstream` (its `UpstreamSettings`) this kind cannot work with, with
        `SettingsRefused` naming the key (Bedrock's: a region to sign for, one credential)."""

    def count_call(self, base_url: str, model: str, api: str, body: Mapping[str, Any]) -> CountCall | None:
        """The call that counts `body` (in the shape of `api`) on this upstream at `base_url`, or
        None when it has no count endpoint for that shape (or the body cannot be said in its shape)."""
        return None

    def held_size_path(self, base_url: str, kind: str, held_id: str) -> tuple[str, ...] | None:
        """Where `GET` says how big held context `held_id` (of `kind`) is, as path segments at the
        upstream's host (Gemini's `cachedContents/{id}`); None when it cannot be asked."""
        return None

    def native_path(self, asks_google: bool) -> bool:
        """Whether a forwarded request that is not counted goes to the provider's native API (at
        the host's root, under its allow-list) rather than under the base URL; `asks_google`: the
        path is one of Google's own, or sent the way Google's clients send it."""
        return False

    def google_preference(self, names_project: bool) -> int | None:
        """For a Google path that names no routed model: how early this upstream is picked (lower
        first), or None when it does not serve Google's paths (`names_project`: the path names a project)."""
        return None

    def describe(self, name: str, base_url: str) -> str:
        """How the start message names the upstream `name` at `base_url`."""
        return f"{name} ({base_url})"

    def signing_keys(self, upstream: object) -> SigningKeys | None:
        """The credentials this provider signs `upstream`'s calls with (its settings), made once per
        upstream by the server; None: it signs nothing."""
        return None

    def finish(self, call: OutgoingCall, keys: object) -> OutgoingCall:
        """`call` as it is sent, signed with `keys` (`SigningKeys.current`): the client's own
        signing headers dropped, the guard's signature over the final method, URL and body added."""
        return call
