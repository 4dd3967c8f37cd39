"""The backends as the guard knows them, and how each request is counted for its upstream: the
backend's tokenizer, a calibrated estimate, or the model's own tokenizer; and what each response teaches.

One `Backends` per app holds, per upstream, what discovery found at start, a `BackendCounter`
per model (the backend's tokenizer behind the shared count cache), and the calibration table.
The handler asks it three things:

    await backends.window(reach, model)               the window the server stated, if it did
    await backends.choose(reach, model, body, ...)    (profile, tokenizer) to plan with, and why
    backends.observe(choice, prompt_tokens, sent)     after a response with `usage.prompt_tokens`

`reach` (`Reach`) says how the guard's own calls reach the upstream: the app's session, its name,
base URL and the headers of the guard's credential.

The choice, in order: the backend's tokenizer when the upstream's `tokenize` option allows it
and the server can tokenize (and answered in time); else the model's own tokenizer when it is
exact; else the estimate, scaled by what calibration learned for this upstream and model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp

from proxy.core.counting.count_cache import CountCache
from proxy.core.counting.request_count import RequestCounter
from proxy.core.counting.tokenizer import PrefetchedTokenizer, Tokenizer
from proxy.core.learning.calibration import Calibration, CalibrationTable, calibrated
from proxy.core.models.model_registry import ModelProfile
from proxy.server.backends.profiles import (
    BackendOptions,
    BackendProfile,
    Discovery,
    discover,
    ollama_window,
    profile_for,
)
from proxy.server.backends.tokenize import BackendCounter
from proxy.server.backends.tokenize_calls import calls_for

Source = Literal["backend", "model", "calibrated", "estimate"]


@dataclass(frozen=True, slots=True)
class Reach:
    """How the guard's own calls reach one upstream (tokenize, a window): the app's session, the
    upstream's name and base URL, and the headers of the guard's credential (None: none)."""

    session: aiohttp.ClientSession
    upstream: str
    base_url: str
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Learning:
    """What an estimate learns from the upstream's usage: the upstream and model whose calibration
    it updates, and the model's own tokenizer (unscaled) that estimated the request."""

    upstream: str
    model: str
    local: Tokenizer


@dataclass(frozen=True)
class Choice:
    """What to plan one request with. `source` is for the log: `backend` (the server's own
    tokenizer), `model` (the model's exact tokenizer), `calibrated` or `estimate`."""

    profile: ModelProfile
    tokenizer: Tokenizer
    source: Source
    calibration: Calibration | None = None
    note: str | None = None  # why the backend's own tokenizer did not count it: said on the request's line
    backend_calls: int = 0
    counter: BackendCounter | None = None  # with `backend`: what counts the texts a trim produces
    learning: Learning | None = None  # with an estimate: what the upstream's usage calibrates

    @property
    def bypasses_cache(self) -> bool:
        """Counts made with this choice must not enter the shared cache under the model's name."""
        return self.source in ("backend", "calibrated")

    async def complete(self) -> bool:
        """Have the backend count the texts this choice's tokenizer counted locally since the last
        call (what a trim produced: a shortened message, its marker, a note). True when it
        counted any, so that a plan re-made with the tokenizer counts more of them exactly."""
        tokenizer = self.tokenizer
        if self.counter is None or not isinstance(tokenizer, PrefetchedTokenizer) or not tokenizer.missing:
            return False
        known = len(tokenizer.counts)
        await self.counter.complete(tokenizer)
        return len(tokenizer.counts) > known

    def bound_unfetched(self) -> None:
        """Texts the backend has not counted are counted by an upper bound from now on (the last
        plan a request gets must not undercount because an estimate ran low)."""
        if isinstance(self.tokenizer, PrefetchedTokenizer):
            self.tokenizer.bound_missing()

    def recount(self, body: Mapping[str, Any]) -> int | None:
        """`body` (a chat body) counted again with the backend's counts; None while some text of
        it is still counted only locally (then `complete()` fetches it)."""
        tokenizer = self.tokenizer
        if not isinstance(tokenizer, PrefetchedTokenizer):
            return None
        total = RequestCounter(self.profile, tokenizer).request(body).total
        return None if tokenizer.missing else total


DEFAULT_OPTIONS = BackendOptions()
# Models per upstream-and-model table kept (a window an Ollama server stated, a backend counter):
# a glob route takes any model name a client writes, and each new one must not grow the process.
MODELS_KEPT = 1024


def _keep_bounded(table: dict[Any, Any]) -> None:
    """Forget the entries `table` holds longest, past `MODELS_KEPT`."""
    while len(table) > MODELS_KEPT:
        del table[next(iter(table))]


@dataclass
class Backends:
    options: Mapping[str, BackendOptions] = field(default_factory=dict)  # by upstream name
    cache: CountCache = field(default_factory=CountCache)
    calibration: CalibrationTable = field(default_factory=CalibrationTable)
    discoveries: dict[str, Discovery] = field(default_factory=dict)
    _counters: dict[tuple[str, str], BackendCounter] = field(default_factory=dict)
    _windows: dict[tuple[str, str], int | None] = field(default_factory=dict)

    def profile_of(self, upstream: str) -> BackendProfile:
        """How the upstream behaves as a backend: what discovery found, else a generic server."""
        found = self.discoveries.get(upstream)
        return found.profile if found is not None else profile_for("generic")

    def options_for(self, upstream: str) -> BackendOptions:
        options = self.options.get(upstream)
        return options if options is not None else DEFAULT_OPTIONS

    async def discover(
        self, session: aiohttp.ClientSession, upstream: str, base_url: str, headers: Mapping[str, str] | None = None
    ) -> Discovery:
        """Ask one upstream what it is (at start, under its discovery deadline) and remember it."""
        found = await discover(session, base_url, self.options_for(upstream), headers)
        self.discoveries[upstream] = found
        return found

    def known_window(self, upstream: str, model: str) -> tuple[bool, int | None]:
        """`window` without awaiting, when nothing is to be asked: (True, the window or None);
        (False, None) for an Ollama model not asked yet."""
        found = self.discoveries.get(upstream)
        if found is None:
            return True, None
        if not found.profile.window_per_model:
            return True, found.window(model)
        key = (upstream, model)
        return (True, self._windows[key]) if key in self._windows else (False, None)

    async def window(self, reach: Reach, model: str) -> int | None:
        """The window the upstream states for `model` (Ollama is asked once per model)."""
        known, stated = self.known_window(reach.upstream, model)
        if not known:
            asked = await ollama_window(reach.session, reach.base_url, model, reach.headers)
            stated = self._windows[(reach.upstream, model)] = asked
            _keep_bounded(self._windows)
        return stated

    async def choose(
        self, reach: Reach, model: str, body: Mapping[str, Any], profile: ModelProfile, local: Tokenizer
    ) -> Choice:
        """The profile and tokenizer to plan `body` with. `local` is the model's own tokenizer
        (the guard's choice from the model map or an override)."""
        upstream = reach.upstream
        chosen = self.local_choice(upstream, model, profile, local)
        if chosen is not None:
            return chosen
        found = self.discoveries.get(upstream)
        assert found is not None, "local_choice answers for an upstream that was not discovered"
        counter = self._counter(reach, model, found)
        note = None
        if counter is not None:
            prepared = await counter.prepare(body, profile, local)
            if prepared.remote:
                return Choice(
                    prepared.profile, prepared.tokenizer, "backend", backend_calls=prepared.calls, counter=counter
                )
            note = prepared.note
        return self._local(upstream, model, profile, local, note)

    def local_choice(self, upstream: str, model: str, profile: ModelProfile, local: Tokenizer) -> Choice | None:
        """`choose` without awaiting, when the upstream's own tokenizer is not to be asked; None when it is."""
        options = self.options_for(upstream)
        found = self.discoveries.get(upstream)
        if options.tokenize != "local" and found is not None and found.can_tokenize:
            return None
        note = None
        if options.tokenize == "backend":
            note = "backend_count_skipped: no tokenize endpoint"  # `tokenize: backend` asked for one
        return self._local(upstream, model, profile, local, note)

    def _local(self, upstream: str, model: str, profile: ModelProfile, local: Tokenizer, note: str | None) -> Choice:
        if local.exact and profile.tokenizer_exact:
            return Choice(profile, local, "model", note=note)
        learned = self.calibration.get(upstream, model)
        scaled = calibrated(local, learned)
        source: Source = "calibrated" if scaled is not local else "estimate"
        learning = None if local.exact else Learning(upstream, model, local)  # an exact count has nothing to correct
        return Choice(profile, scaled, source, learned, note, learning=learning)

    def _counter(self, reach: Reach, model: str, found: Discovery) -> BackendCounter | None:
        key = (reach.upstream, model)
        counter = self._counters.get(key)
        if counter is None:
            calls = calls_for(found, reach.session, reach.base_url, model, reach.headers)
            if calls is None:
                return None
            options = self.options_for(reach.upstream)
            counter = BackendCounter(
                f"{reach.upstream}/{model}",
                calls,
                self.cache,
                options,
            )
            self._counters[key] = counter
            _keep_bounded(self._counters)
        elif reach.headers is not None:  # a token the upstream's auth refreshed since the counter was made
            counter.calls.use_headers(reach.headers)
        return counter

    def observe(
        self, choice: Choice, provider_prompt_tokens: int, sent: Mapping[str, Any], cache: CountCache | None = None
    ) -> Calibration | None:
        """Learn from a response's `usage.prompt_tokens` for `sent`, the body that was sent.
        Only estimates learn (`Choice.learning`): a count by the backend or an exact tokenizer has
        nothing to correct."""
        learning = choice.learning
        if learning is None:
            return None
        counted = RequestCounter(choice.profile, learning.local, cache).request(sent)
        if counted.estimated:  # a part's size estimated (media): the usage is about this request alone
            return None
        return self.calibration.observe(learning.upstream, learning.model, provider_prompt_tokens, counted.total)
