"""Counting a request with the backend's own tokenizer, one new text at a time.

A server that can tokenize (llama-server, llama-cpp-python, vLLM) is asked for the tokens of
each *text* of a request (message contents, names, tool arguments), never for the whole request:
texts are cached by digest, so a conversation re-sent every turn costs one call per new message.
The chat template's framing is measured once per model, from tiny conversations the server
renders (or, on llama-cpp-python, which cannot render without generating, answers with
`max_tokens: 1`), and becomes the `ChatFormat` the core counts with (`proxy.core.models.framing`). The
calls each kind of server answers are `proxy.server.backends.tokenize_calls`; the tokenizers the
core counts with, from the counts fetched here, are `proxy.core.counting.tokenizer`.

The upstream's `BackendOptions` set the deadlines and the concurrency: each request's calls, the
wait for the framing included, run under one deadline (`tokenize_timeout`), at most
`tokenize_concurrency` texts asked at a time; the framing's measurement goes on in the background
up to `framing_timeout`. A text the backend did not count in time is counted by the local
estimate, and the count says it is not exact. A backend that cannot be reached (no
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
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy.config.backends import BackendOptions
from proxy.core.counting.count_cache import CountCache
from proxy.core.counting.request_count import RequestCounter
from proxy.core.counting.tokenizer import PrefetchedTokenizer, RecordingTokenizer, Tokenizer, tool_call_texts
from proxy.core.models.framing import PROBE_CONVERSATIONS, PROBE_TEXTS, Framing, framing_from
from proxy.core.models.model_registry import ModelProfile
from proxy.server.backends.profiles import BackendDown
from proxy.server.backends.tokenize_calls import TokenizeCalls

FAILURE_COOLDOWN = 30.0


async def measure_framing(calls: TokenizeCalls, count: Callable[[str], Any]) -> Framing | None:
    """The framing of `calls`' template, from probe conversations; None if a call fails or the
    numbers make no sense (a template that is not one frame per message). A fourth probe, with
    a tool call, tells how the template renders calls; a server that refuses it leaves the
    core's default for them."""
    pieces = await asyncio.gather(*(count(t) for t in PROBE_TEXTS))
    if any(p is None for p in pieces):
        return None
    two, four, one, exchange = await asyncio.gather(*(calls.conversation(c) for c in PROBE_CONVERSATIONS))
    return framing_from(pieces, two, four, one, exchange)


@dataclass(frozen=True)
class Prepared:
    """What the core counts one request with."""

    profile: ModelProfile
    tokenizer: Tokenizer
    remote: bool  # every text was counted by the backend
    calls: int = 0  # tokenize calls this request cost
    note: str | None = None


class BackendCounter:
    """The backend's tokenizer for one upstream and model, with its counts cached, asked within
    the deadlines and the concurrency of the upstream's `options`."""

    def __init__(
        self,
        name: str,
        calls: TokenizeCalls,
        cache: CountCache,
        options: BackendOptions = BackendOptions(),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = f"backend:{name}"
        self.calls = calls
        self.cache = cache
        self.timeout = options.tokenize_timeout
        self.framing_timeout = options.framing_timeout
        self.clock = clock
        self._limit = asyncio.Semaphore(options.tokenize_concurrency)
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
            return Prepared(profile, fallback, False, note="backend_count_skipped: failed recently")
        framing = await self._framing_within_deadline()
        if framing is None:
            return Prepared(profile, fallback, False, note="backend_count_skipped: template framing unknown")
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
        note = None if complete else f"backend_count_partial: {uncounted} texts counted locally"
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
