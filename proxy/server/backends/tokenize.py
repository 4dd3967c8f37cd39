"""Counting a request with the backend's own tokenizer, one new text at a time.

A server that can tokenize (llama-server, llama-cpp-python, vLLM) is asked for the tokens of
each *text* of a request (message contents, names, tool arguments), never for the whole request:
texts are cached by digest, so a conversation re-sent every turn costs one call per new message.
The chat template's framing is measured once per model, from three tiny conversations the server
renders (or, on llama-cpp-python, which cannot render without generating, answers with
`max_tokens: 1`):

    [system, user]                      -> 2 frames + reply priming
    [system, user, assistant, user]     -> 4 frames + reply priming
    [user]                              -> 1 frame + reply priming + a default system prompt, if
                                           the template adds one when the client sent none
    [system, user, assistant+call, tool] -> how a tool call is rendered (SmolLM2's template
                                           drops calls: their names and arguments cost nothing)

and becomes the `ChatFormat` the core counts with. Each request's calls, the wait for the framing
included, run under one deadline (`tokenize_timeout`); the framing's measurement goes on in the
background up to `framing_timeout`. A text the backend did not count in time is counted by the
local estimate, and the count says it is not exact. A backend that cannot be reached (no
connection, a 5xx) or misses a deadline (a request's, or the framing's, however the wait ended)
is left alone for `FAILURE_COOLDOWN` seconds; a text it answers about without a count (a 4xx: it
refused that text, or an answer over `MAX_ANSWER_BYTES`) is counted locally, that text only: one
client's text must not switch the backend's counting off for every other client. Answers are
read up to that size and parsed off the event loop when large (`proxy.server.backends.profiles.answered_json`).

The core stays synchronous: `BackendCounter.prepare()` (async) fetches every count the core will
ask for, found by a first pass with a recording tokenizer, and returns a plain `Tokenizer`
holding them.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp

from proxy.core.count_cache import CountCache
from proxy.core.models import ChatFormat, ModelProfile
from proxy.core.request_count import RequestCounter
from proxy.core.tokenizer import Tokenizer
from proxy.server.backends.profiles import BackendDown, Discovery, answered_json, server_root, token_count

PROBE = "x"
FAILURE_COOLDOWN = 30.0


class TokenizeCalls(Protocol):
    """The two questions a backend can answer: tokens in a text (no special tokens added), and
    prompt tokens of a chat rendered by its template with the generation prompt."""

    async def text(self, text: str) -> int | None: ...

    async def conversation(self, messages: list[dict[str, Any]]) -> int | None: ...

    def use_headers(self, headers: Mapping[str, str]) -> None:
        """Send `headers` from now on (the upstream's credential, refreshed)."""


@dataclass
class _Http:
    session: aiohttp.ClientSession
    base_url: str
    model: str
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def root(self) -> str:
        return server_root(self.base_url)

    async def post(self, url: str, body: object) -> object:
        """`answered_json`: BackendDown when the server could not answer."""
        return await answered_json(self.session, "POST", url, body, self.headers)

    def use_headers(self, headers: Mapping[str, str]) -> None:
        if headers != self.headers:
            self.headers = dict(headers)


class LlamaServerCalls(_Http):
    """llama.cpp's llama-server: `POST /tokenize` and `POST /apply-template`."""

    async def text(self, text: str) -> int | None:
        return token_count(await self.post(f"{self.root}/tokenize", {"content": text, "add_special": False}))

    async def conversation(self, messages: list[dict[str, Any]]) -> int | None:
        rendered = await self.post(f"{self.root}/apply-template", {"messages": messages})
        prompt = rendered.get("prompt") if isinstance(rendered, dict) else None
        if not isinstance(prompt, str):
            return None
        return token_count(await self.post(f"{self.root}/tokenize", {"content": prompt, "add_special": True}))


class LlamaCppPythonCalls(_Http):
    """llama-cpp-python: `POST /extras/tokenize/count` (it parses special tokens, like its chat
    prompts, and adds BOS where the vocabulary asks for one); its template only by answering."""

    async def text(self, text: str) -> int | None:
        return token_count(await self.post(f"{self.root}/extras/tokenize/count", {"input": text, "model": self.model}))

    async def conversation(self, messages: list[dict[str, Any]]) -> int | None:
        body = {"model": self.model, "messages": messages, "max_tokens": 1, "temperature": 0}
        answer = await self.post(f"{self.base_url.rstrip('/')}/chat/completions", body)
        usage = answer.get("usage") if isinstance(answer, dict) else None
        prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        return prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else None


class VllmCalls(_Http):
    """vLLM: `POST /tokenize` with a `prompt`, or with `messages` (its chat template applied)."""

    async def text(self, text: str) -> int | None:
        body = {"model": self.model, "prompt": text, "add_special_tokens": False}
        return token_count(await self.post(f"{self.root}/tokenize", body))

    async def conversation(self, messages: list[dict[str, Any]]) -> int | None:
        body = {"model": self.model, "messages": messages, "add_generation_prompt": True}
        return token_count(await self.post(f"{self.root}/tokenize", body))


def calls_for(
    discovery: Discovery,
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    headers: Mapping[str, str] | None = None,
) -> TokenizeCalls | None:
    """The tokenize calls of a discovered server, or None when it cannot tokenize."""
    kinds: dict[str | None, type[LlamaServerCalls | LlamaCppPythonCalls | VllmCalls]] = {
        "llama-server": LlamaServerCalls,
        "llama-cpp-python": LlamaCppPythonCalls,
        "vllm": VllmCalls,
    }
    calls = kinds.get(discovery.flavor)
    return calls(session, base_url, model, dict(headers or {})) if calls is not None else None


@dataclass(frozen=True, slots=True)
class Framing:
    """A chat template's cost around the texts, as measured."""

    per_message: int  # beyond the role's own tokens
    reply_priming: int
    implicit_system: int  # added when the first message is not a system message
    per_tool_call: int | None = None  # around a call's name and arguments; None: not measured
    renders_tool_calls: bool = True  # False: the template drops assistant tool calls entirely
    # A `tool` result as the template shows it (role `tool` and its content), relative to the
    # core's accounting of one (a `function` message named after its call, less `per_name`);
    # None: not measured.
    tool_result_adjust: int | None = None

    def chat_format(self, base: ChatFormat) -> ChatFormat:
        fmt = replace(base, per_message=self.per_message, reply_priming=self.reply_priming)
        if self.tool_result_adjust is not None:
            fmt = replace(fmt, function_message_adjust=self.tool_result_adjust - base.per_name)
        if not self.renders_tool_calls:
            return replace(fmt, function_call_overhead=0, tool_call_margin=0)
        if self.per_tool_call is None:
            return fmt
        return replace(fmt, function_call_overhead=self.per_tool_call)


def _say(role: str) -> dict[str, Any]:
    return {"role": role, "content": PROBE}


_CALL = {"id": "call_1", "type": "function", "function": {"name": PROBE, "arguments": "{}"}}
_TOOL_EXCHANGE = [
    _say("system"),
    _say("user"),
    {"role": "assistant", "content": PROBE, "tool_calls": [_CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": PROBE},
]


async def measure_framing(calls: TokenizeCalls, count: Callable[[str], Any]) -> Framing | None:
    """The framing of `calls`' template, from probe conversations; None if a call fails or the
    numbers make no sense (a template that is not one frame per message). A fourth probe, with
    a tool call, tells how the template renders calls; a server that refuses it leaves the
    core's default for them."""
    pieces = await asyncio.gather(*(count(t) for t in (PROBE, "system", "user", "assistant", "tool", "{}", "function")))
    if any(p is None for p in pieces):
        return None
    text, system, user, assistant, tool, arguments, function = pieces
    two, four, one, exchange = await asyncio.gather(
        calls.conversation([_say("system"), _say("user")]),
        calls.conversation([_say("system"), _say("user"), _say("assistant"), _say("user")]),
        calls.conversation([_say("user")]),
        calls.conversation(_TOOL_EXCHANGE),
    )
    if two is None or four is None or one is None:
        return None
    per_message = math.ceil((four - two - assistant - user - 2 * text) / 2)
    priming = two - 2 * per_message - system - user - 2 * text
    implicit = one - (per_message + user + text + priming)
    if per_message < 0 or priming < 0 or implicit < 0:
        return None
    framing = Framing(per_message, priming, implicit)
    if exchange is None:
        return framing
    plain = 4 * per_message + system + user + assistant + tool + 4 * text + priming
    call = exchange - plain  # what the one call added: its framing, its name ("x") and arguments ("{}")
    if call <= 0:
        # Calls are dropped, and their names with them (counted as nothing, see `prepare`): a
        # result costs its frame, its role and its content, as any message does.
        return replace(framing, per_tool_call=0, renders_tool_calls=False, tool_result_adjust=tool - function)
    # Calls are rendered; a result is taken to be shown as any message is, by its role. The core
    # also counts the result's call name, which such templates rarely show: that errs high.
    return replace(framing, per_tool_call=max(0, call - text - arguments), tool_result_adjust=tool - function)


def tool_call_texts(body: Mapping[str, Any]) -> set[str]:
    """The names and arguments of the assistant tool calls in `body`."""
    texts: set[str] = set()
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        calls = message.get("tool_calls") if isinstance(message, Mapping) else None
        for call in calls if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                texts.update(v for v in (function.get("name"), function.get("arguments")) if isinstance(v, str))
    return texts


@dataclass
class RecordingTokenizer:
    """Counts with `base` and remembers every text it was asked about."""

    base: Tokenizer
    texts: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def identity(self) -> str:
        return self.base.identity

    @property
    def exact(self) -> bool:
        return self.base.exact

    def count(self, text: str) -> int:
        if text:
            self.texts.add(text)
        return self.base.count(text)

    def count_many(self, texts: list[str]) -> list[int]:
        return [self.count(t) for t in texts]


@dataclass
class PrefetchedTokenizer:
    """The backend's counts of one request's texts; any other text (one a trim shortened, a note
    it inserted) is counted by `fallback` and remembered in `missing`, and then the count is no
    longer exact until `BackendCounter.complete()` has fetched those too. One per request: never
    cache counts under its name."""

    name: str
    counts: dict[str, int]
    fallback: Tokenizer
    missing: set[str] = field(default_factory=set)
    # After `bound_missing()`, a text the backend has not counted costs at most its UTF-8 bytes
    # plus one (no byte-level BPE or byte-fallback SentencePiece token is shorter than a byte; the
    # one is a dummy-prefix space): a plan made then cannot undercount, whatever the estimate.
    bounded: bool = False

    @property
    def identity(self) -> str:
        return self.name

    @property
    def exact(self) -> bool:
        return not self.missing

    def count(self, text: str) -> int:
        if not text:
            return 0
        n = self.counts.get(text)
        if n is None:
            self.missing.add(text)
            estimate = self.fallback.count(text)
            return max(estimate, len(text.encode("utf-8", "surrogatepass")) + 1) if self.bounded else estimate
        return n

    def bound_missing(self) -> None:
        """From now on, texts the backend has not counted are counted by their upper bound."""
        self.bounded = True

    def count_many(self, texts: list[str]) -> list[int]:
        return [self.count(t) for t in texts]


@dataclass(frozen=True)
class Prepared:
    """What the core counts one request with."""

    profile: ModelProfile
    tokenizer: Tokenizer
    remote: bool  # every text was counted by the backend
    calls: int = 0  # tokenize calls this request cost
    note: str | None = None


class BackendCounter:
    """The backend's tokenizer for one upstream and model, with its counts cached."""

    def __init__(
        self,
        name: str,
        calls: TokenizeCalls,
        cache: CountCache,
        timeout: float = 2.0,
        concurrency: int = 4,
        clock: Callable[[], float] = time.monotonic,
        framing_timeout: float = 30.0,
    ) -> None:
        self.name = f"backend:{name}"
        self.calls = calls
        self.cache = cache
        self.timeout = timeout
        self.framing_timeout = framing_timeout
        self.clock = clock
        self._limit = asyncio.Semaphore(concurrency)
        self._framing: Framing | None = None
        self._empty: int | None = None  # tokens the server adds to any text (a BOS), subtracted
        self._setup = asyncio.Lock()
        self._measuring: asyncio.Future[Framing | None] | None = None
        self._down_until = 0.0

    def _key(self, text: str) -> tuple[str, bytes]:
        return (self.name, hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest())

    async def _count(self, text: str) -> int | None:
        try:
            async with self._limit:
                n = await self.calls.text(text)
        except BackendDown:
            self._down_until = self.clock() + FAILURE_COOLDOWN
            return None
        if n is None:  # refused: this text is counted locally, the backend stays in use
            return None
        n = max(0, n - (self._empty or 0))
        self.cache.put(self._key(text), n)
        return n

    async def framing(self) -> Framing | None:
        """The template's framing, measured on first use (and again after a failure), within
        `framing_timeout`; a failure or a deadline passed leaves the backend alone for
        `FAILURE_COOLDOWN` seconds."""
        if self._framing is not None:
            return self._framing
        async with self._setup:
            if self._framing is None and self.clock() >= self._down_until:
                try:
                    async with asyncio.timeout(self.framing_timeout):
                        empty = await self.calls.text("")
                        if empty is not None:
                            self._empty = empty
                            self._framing = await measure_framing(self.calls, self._count)
                except (BackendDown, TimeoutError):
                    pass
                finally:  # cancelled too (its waiter gone): the cooldown is set on every failure
                    if self._framing is None:
                        self._down_until = self.clock() + FAILURE_COOLDOWN
                    else:  # measured after all (slowly): the backend counts again from now on
                        self._down_until = 0.0
        return self._framing

    async def _framing_within_deadline(self) -> Framing | None:
        """The framing, waited for at most `timeout` (a request's whole tokenize deadline): the
        measurement goes on in the background, up to `framing_timeout`, for the requests after."""
        if self._framing is not None:
            return self._framing
        task = self._measuring
        if task is None or task.done():
            task = self._measuring = asyncio.ensure_future(self.framing())
        try:
            return await asyncio.wait_for(asyncio.shield(task), self.timeout)
        except TimeoutError:  # a deadline missed: the requests after this one do not wait for it
            self._down_until = self.clock() + FAILURE_COOLDOWN
            return None

    async def prepare(self, body: Mapping[str, Any], profile: ModelProfile, fallback: Tokenizer) -> Prepared:
        """Fetch the counts of every text in `body` the cache lacks, within the deadline."""
        if self.clock() < self._down_until:
            return Prepared(profile, fallback, False, note="backend tokenizer failed recently")
        framing = await self._framing_within_deadline()
        if framing is None:
            return Prepared(profile, fallback, False, note="backend template framing unknown")
        fmt = framing.chat_format(profile.chat_format)
        messages = body.get("messages")
        first = messages[0] if isinstance(messages, list) and messages else None
        if not (isinstance(first, Mapping) and first.get("role") in ("system", "developer")):
            fmt = replace(fmt, reply_priming=fmt.reply_priming + framing.implicit_system)
        counted_profile = replace(profile, chat_format=fmt, tokenizer_exact=True)
        recorder = RecordingTokenizer(fallback)
        # The first pass counts the whole body locally: in a thread, as the plan is, not on the loop.
        await asyncio.to_thread(RequestCounter(counted_profile, recorder).request, body)
        counts: dict[str, int] = {}
        if not framing.renders_tool_calls:  # the template drops them: what they say costs nothing
            dropped = tool_call_texts(body) & recorder.texts
            counts.update(dict.fromkeys(dropped, 0))
            recorder.texts -= dropped
        calls = await self._fetch(recorder.texts, counts)
        tokenizer = PrefetchedTokenizer(self.name, counts, fallback)
        uncounted = len(recorder.texts - counts.keys())
        complete = uncounted == 0
        note = None if complete else f"{uncounted} texts counted locally (backend too slow, or it refused them)"
        return Prepared(counted_profile, tokenizer, complete, calls, note)

    async def complete(self, tokenizer: PrefetchedTokenizer) -> int:
        """Fetch the texts `tokenizer` had to count locally (what a trim produced: a shortened
        message, a marker, a note) into its counts, cache first, within the deadline; after it,
        a recount with `tokenizer` is the backend's. Returns the tokenize calls it cost; texts the
        backend did not count in time stay in `tokenizer.missing`."""
        wanted, tokenizer.missing = tokenizer.missing, set()
        if self.clock() < self._down_until:
            tokenizer.missing |= wanted
            return 0
        calls = await self._fetch(wanted, tokenizer.counts)
        tokenizer.missing |= wanted - tokenizer.counts.keys()
        return calls

    async def _fetch(self, texts: set[str], counts: dict[str, int]) -> int:
        """Put the backend's count of each of `texts` into `counts`: from the cache, else asked
        for, all under one deadline. Returns the calls made."""
        missing: list[str] = []
        for text in texts:
            hit = self.cache.get(self._key(text))
            if hit is None:
                missing.append(text)
            else:
                counts[text] = hit
        if missing:
            tasks = {asyncio.ensure_future(self._count(t)): t for t in missing}
            done, pending = await asyncio.wait(tasks, timeout=self.timeout)
            for task in pending:
                task.cancel()
            if pending:  # the deadline passed: the backend is too slow to be asked for a while
                self._down_until = self.clock() + FAILURE_COOLDOWN
            for task in done:
                n = task.result() if not task.cancelled() and task.exception() is None else None
                if n is not None:
                    counts[tasks[task]] = n
        return len(missing)
