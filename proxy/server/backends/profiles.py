"""What kind of server an upstream is, and what it can tell the guard about itself.

A backend profile says, per kind (`openai`, `vertex`, `vllm`, `llamacpp`, `ollama`, `generic`):
whether prompt + `max_tokens` must fit the window (OpenAI, vLLM and Vertex refuse a request
whose sum does not; llama.cpp lowers `max_tokens` itself, so only the prompt must fit), whether
it honours `stream_options.include_usage`, what its overflow errors say, and whether it signals
an overflow at all (Ollama cuts the prompt silently; llama-cpp-python answers an over-window
*stream* with `200` and an empty body).

`discover()` asks the server itself, each call under one deadline, and every failure leaves the
answer unknown (the model map and the local estimate stay in force):

    llama.cpp's llama-server   GET /props               default_generation_settings.n_ctx
                               POST /tokenize, POST /apply-template
    llama-cpp-python           POST /extras/tokenize/count   (no window endpoint: the first
                                                              overflow error teaches it)
    vLLM                       GET /v1/models           data[].max_model_len
                               POST /tokenize           (with `messages`: the chat template applied)
    Ollama                     GET /api/version, POST /api/show   parameters `num_ctx`

The response parsers are pure functions, tested against responses recorded from real servers
(tests/data/backends/).
"""

from __future__ import annotations

import asyncio
import functools
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import aiohttp

from proxy.config.backends import KINDS as KINDS
from proxy.config.backends import TOKENIZE_MODES as TOKENIZE_MODES
from proxy.config.backends import BackendOptions as BackendOptions
from proxy.config.backends import Kind as Kind
from proxy.config.backends import TokenizeMode as TokenizeMode
from proxy.core.trimming.budget import BudgetPolicy
from proxy.providers.kinds import provider_for
from proxy.providers.provider import BackendProfile as BackendProfile
from proxy.wire.codec import loads

Flavor = Literal["llama-server", "llama-cpp-python", "vllm", "ollama"]

# Ollama runs a model with `num_ctx` tokens of context unless told otherwise, and silently drops the
# start of a longer prompt. Its default has been 2048 for most releases; a smaller window guessed
# only trims more, a larger one would let Ollama cut the system prompt.
OLLAMA_DEFAULT_NUM_CTX = 2048


def profile_for(kind: str) -> BackendProfile:
    """How a server of backend kind `kind` behaves (`proxy.config.backends.KINDS`): its provider says."""
    try:
        profile = provider_for(kind).backend
    except ValueError:
        profile = None
    if profile is None:
        raise ValueError(f"unknown upstream kind {kind!r}; known: {', '.join(KINDS)}")
    return profile


@dataclass(frozen=True)
class Discovery:
    """What an upstream said about itself. Windows are per model id as the server names it;
    `default_window` is the window of a server that runs one model under any name."""

    kind: Kind
    flavor: Flavor | None = None
    windows: Mapping[str, int] = field(default_factory=dict)
    default_window: int | None = None
    notes: tuple[str, ...] = ()

    @functools.cached_property
    def profile(self) -> BackendProfile:
        """How the server behaves as a backend: its kind's provider says, once per discovery."""
        return profile_for(self.kind)

    @property
    def can_tokenize(self) -> bool:
        return self.flavor in ("llama-server", "llama-cpp-python", "vllm")

    def window(self, model: str) -> int | None:
        return self.windows.get(model, self.default_window)


# ---- parsers of the servers' own answers (pure) ----


def _positive(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def llama_server_props(data: object) -> tuple[str | None, int] | None:
    """llama-server's `GET /props`: (model alias, n_ctx per slot), or None if it is not that."""
    if not isinstance(data, dict):
        return None
    settings = data.get("default_generation_settings")
    n_ctx = _positive(settings.get("n_ctx")) if isinstance(settings, dict) else _positive(data.get("n_ctx"))
    if n_ctx is None:
        return None
    alias = data.get("model_alias")
    return (alias if isinstance(alias, str) else None), n_ctx


def model_list_windows(data: object) -> tuple[Flavor | None, dict[str, int]]:
    """`GET /v1/models`: the windows it states (vLLM's `max_model_len`, llama-server's
    `meta.n_ctx`) and the flavor those fields give away."""
    entries = data.get("data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        return None, {}
    flavor: Flavor | None = None
    windows: dict[str, int] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("id"), str):
            continue
        meta = entry.get("meta")
        if (n := _positive(entry.get("max_model_len"))) is not None:
            flavor, windows[entry["id"]] = "vllm", n
        elif isinstance(meta, dict) and (n := _positive(meta.get("n_ctx"))) is not None:
            flavor, windows[entry["id"]] = "llama-server", n
    return flavor, windows


# One line (spaces and tabs only: `\s` would also take newlines, and rescan each run of blank lines from every
# line start in it, quadratic in an upstream's answer).
_NUM_CTX = re.compile(r"^[ \t]*num_ctx[ \t]+(\d+)[ \t\r]*$", re.M)


def ollama_show_window(data: object) -> int:
    """Ollama's `POST /api/show`: the `num_ctx` the model runs with (its Modelfile's, else
    Ollama's default), never more than the model was trained for."""
    if not isinstance(data, dict):
        return OLLAMA_DEFAULT_NUM_CTX
    parameters = data.get("parameters")
    match = _NUM_CTX.search(parameters) if isinstance(parameters, str) else None
    window = int(match.group(1)) if match else OLLAMA_DEFAULT_NUM_CTX
    info = data.get("model_info")
    trained = [v for k, v in info.items() if k.endswith(".context_length")] if isinstance(info, dict) else []
    limit = next((n for v in trained if (n := _positive(v)) is not None), None)
    return min(window, limit) if limit else window


def token_count(data: object) -> int | None:
    """The number of tokens in a tokenize answer: vLLM's `count`, llama-cpp-python's `count`,
    or the length of `tokens` (llama-server, llama-cpp-python's /extras/tokenize)."""
    if not isinstance(data, dict):
        return None
    count = data.get("count")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    tokens = data.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


# ---- asking the server ----


def server_root(base_url: str) -> str:
    """The server's root: the upstream's base URL less its trailing API version (`/v1`)."""
    return re.sub(r"/v\d+[a-z0-9]*/?$", "", base_url.rstrip("/"))


class BackendDown(Exception):
    """The server could not answer a call (no connection, a timeout, a 5xx): not a refusal of what
    was asked, the server itself."""


# What the guard reads of its own calls' answers (tokenize, template, discovery): an answer larger
# than `MAX_ANSWER_BYTES` is not read on (the call counts as not answered: the text is counted
# locally); one larger than `PARSE_ON_LOOP_BYTES` is parsed in a thread, never on the event loop.
MAX_ANSWER_BYTES = 8 * 1024 * 1024
PARSE_ON_LOOP_BYTES = 64 * 1024


class AnswerTooLarge(ValueError):
    """An answer over `MAX_ANSWER_BYTES`: what it said is not read."""


async def read_bounded(response: aiohttp.ClientResponse, max_bytes: int = MAX_ANSWER_BYTES) -> bytes:
    """The body of `response`, or AnswerTooLarge as soon as it is known to exceed `max_bytes`."""
    declared = response.content_length
    if declared is not None and declared > max_bytes:
        raise AnswerTooLarge(f"the answer declares {declared} bytes, over {max_bytes}")
    body = bytearray()
    async for chunk in response.content.iter_any():
        body += chunk
        if len(body) > max_bytes:
            raise AnswerTooLarge(f"the answer is over {max_bytes} bytes")
    return bytes(body)


async def parsed_json(raw: bytes) -> object:
    """`raw` parsed as JSON (ValueError if it is not), off the event loop when it is large."""
    if len(raw) > PARSE_ON_LOOP_BYTES:
        return await asyncio.to_thread(loads, raw)
    return loads(raw)


async def answered_json(
    session: aiohttp.ClientSession, method: str, url: str, body: object = None, headers: Mapping[str, str] | None = None
) -> object:
    """The JSON of a 2xx answer; None for an answer without one (another status, not JSON, over
    `MAX_ANSWER_BYTES`); BackendDown when the server could not answer. A `body` of bytes is JSON
    serialised already (off the event loop, for a large one)."""
    sent: dict[str, Any] = {"json": body, "headers": headers}
    if isinstance(body, bytes):
        sent = {"data": body, "headers": {**(headers or {}), "Content-Type": "application/json"}}
    try:
        async with session.request(method, url, allow_redirects=False, **sent) as response:
            if response.status >= 500:
                raise BackendDown(f"{url} answered {response.status}")
            if response.status >= 300:
                return None
            return await parsed_json(await read_bounded(response))
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise BackendDown(f"{url}: {type(exc).__name__}") from exc
    except ValueError:  # not JSON, or too large to read
        return None


async def upstream_json(
    session: aiohttp.ClientSession, method: str, url: str, body: object = None, headers: Mapping[str, str] | None = None
) -> object:
    """The JSON of a 2xx answer, or None for anything else (an error status, not JSON, a failure)."""
    try:
        return await answered_json(session, method, url, body, headers)
    except BackendDown:
        return None


async def discover(
    session: aiohttp.ClientSession,
    base_url: str,
    options: BackendOptions,
    headers: Mapping[str, str] | None = None,
) -> Discovery:
    """Ask the server at `base_url` what it is, within `options.discovery_timeout` in all. A
    declared kind is trusted; `auto` is decided by which endpoints answer. Hosted APIs (`openai`,
    `vertex`) are never probed."""
    if not options.probed:
        return Discovery(options.declared)
    try:
        found = await asyncio.wait_for(_discover(session, base_url, options, headers), options.discovery_timeout)
    except TimeoutError:
        notes = (f"discovery took over {options.discovery_timeout:g}s; nothing learned",)
        return Discovery(options.declared, notes=notes)
    if not options.decided_by_server and options.declared != found.kind:
        return replace(found, kind=options.declared)  # what the server's endpoints suggest, its operator overrules
    return found


async def _discover(
    session: aiohttp.ClientSession, base_url: str, options: BackendOptions, headers: Mapping[str, str] | None
) -> Discovery:
    root = server_root(base_url)
    props, models, version = await asyncio.gather(
        upstream_json(session, "GET", f"{root}/props", headers=headers),
        upstream_json(session, "GET", f"{base_url.rstrip('/')}/models", headers=headers),
        upstream_json(session, "GET", f"{root}/api/version", headers=headers),
    )
    flavor, windows = model_list_windows(models)
    server = llama_server_props(props)
    if server is not None:
        alias, n_ctx = server
        return Discovery("llamacpp", "llama-server", {**windows, **({alias: n_ctx} if alias else {})}, n_ctx)
    if flavor is not None:
        single = next(iter(windows.values())) if len(windows) == 1 else None
        return Discovery("vllm" if flavor == "vllm" else "llamacpp", flavor, windows, single)
    if isinstance(version, dict) and isinstance(version.get("version"), str):
        return Discovery("ollama", "ollama")
    counted = await upstream_json(session, "POST", f"{root}/extras/tokenize/count", {"input": "ping"}, headers)
    if token_count(counted) is not None:
        return Discovery(
            "llamacpp", "llama-cpp-python", notes=("llama-cpp-python states no window; overflow errors teach it",)
        )
    return Discovery(options.declared, notes=("the server answered none of the known discovery endpoints",))


async def ollama_window(
    session: aiohttp.ClientSession, base_url: str, model: str, headers: Mapping[str, str] | None = None
) -> int | None:
    """The window Ollama runs `model` with, or None if it does not know the model."""
    data = await upstream_json(session, "POST", f"{server_root(base_url)}/api/show", {"model": model}, headers)
    return ollama_show_window(data) if isinstance(data, dict) else None


def forwardable_request_id(profile: BackendProfile, value: str) -> bool:
    """Whether a client's `x-request-id` may go to this upstream as it is."""
    if not profile.request_id_must_be_uuid:
        return True
    try:
        uuid.UUID(value)
    except ValueError:
        return False
    return True


def budget_policy(profile: BackendProfile, policy: BudgetPolicy, min_output: int | None = None) -> BudgetPolicy:
    """The budget policy for requests to a server like `profile`. One that must fit prompt +
    `max_tokens` keeps all that was asked free; llama.cpp and Ollama lower `max_tokens` to what
    the window leaves, so the reserve is what they will really leave, at least `min_output`
    (the upstream's `min_output_tokens`; None: the default reserve)."""
    if profile.output_must_fit:
        return policy
    return replace(policy, output_must_fit=False, min_output=min_output)
