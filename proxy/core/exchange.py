"""The life of one guarded request as a pure state machine that yields commands: route, choose a
tokenizer, look up a correction, plan, recount, summarise, send, correct, re-plan. The server
performs each command and answers it; nothing here awaits, sends, logs or calls back into the
server (mitmproxy's layers work the same way: `err = yield OpenConnection(server)`). The commands
and replies are `proxy.core.commands`.

    exchange = Exchange("enforce", read_whole=True)
    command = exchange.start()                  # FindRoute()
    command = exchange.send(routed)             # LookUpCorrection() (ChooseTokenizer() first if the route cannot say)
    command = exchange.send(None)               # PlanFor(window=None): no correction, the model's window
    command = exchange.send(plan)               # Send(body, plan) or Reject(plan), Recount, Summarise...
    command = exchange.send(Answered(400, error, sent))   # PlanFor(corrected window), then Send again
    command = exchange.send(Delivered(whole=True))        # Remember(correction) when a retry won
    command = exchange.send(None)               # None: the exchange is over

Each command names its reply:

| command                    | the server                                           | replies        |
| -------------------------- | ---------------------------------------------------- | -------------- |
| `FindRoute()`              | finds the model's route (asks the upstream for the   | `Routed`       |
|                            | served model's window, loads its vocabulary, once)   |                |
| `ChooseTokenizer()`        | asks whether the backend's tokenizer counts the body | `Chosen`     |
| `LookUpCorrection()`       | reads a correction kept for the upstream and model   | `Correction` or None |
| `LookUpHeld()`             | what the context the provider holds for the request  | `Held`         |
|                            | weighs (only asked of a request that names some)     |                |
| `PlanFor(window, held)`    | counts and trims for `window`, renders the API shape | `Plan`         |
|                            | (`held` tokens counted with it, never cut)           |                |
| `ProviderCount(plan)`      | asks the upstream's count endpoint, at the edge only | `Plan` or None |
|                            | (a plan made from a bound, never an exact count)     |                |
| `Recount(body)`            | has the backend's tokenizer count `body`             | `Recounted` or None (cannot now) |
| `Summarise(request)`       | asks the summariser (`trim.summarize_dropped`)       | `Summary`      |
| `Render(view)`             | writes a chat-view cut back in the API's shape       | the body       |
| `Note(name, present)`      | adds (removes) a note on the request's log line      | None           |
| `Send(body, plan)`         | forwards (the bytes as received when `body` is None) | `Delivered` or `Answered` |
| `Remember(correction)`     | keeps a correction for the upstream and model        | None           |
|                            | (a retry won, or the provider's smaller window could |                |
|                            | not hold the request, which is then refused)         |                |
| `Reject(plan)`, `Relay()`  | answers 400 / relays the upstream's own answer       | (the end)      |

A request that names context the provider holds (a stored response, a conversation, a cache) is
counted as held + sent: what is held cannot be cut, so the plan cuts what was sent where that is
enough and is refused otherwise, unless the client asked the provider to truncate (`truncation:
"auto"`): then it goes as it came, noted `provider_truncates`. When the held part is unknown the
request is counted as sent (its notes say so).

At most one retry, and only when the upstream's own error says the context was exceeded in a
plausible way; see `proxy.core.learning.corrections`. An overflow error is kept (`overflow`) for
the record whether it taught anything or not. With the backend's own tokenizer (`recounts`), what a
trim produced is counted by the backend too, for up to `BACKEND_ROUNDS` re-plans.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import replace
from typing import Any, Literal

from proxy.core.commands import (
    CHOOSE_TOKENIZER,
    FIND_ROUTE,
    FOR_MODEL_WINDOW,
    LOOK_UP_CORRECTION,
    LOOK_UP_HELD,
    Answered,
    Chosen,
    Command,
    Delivered,
    Held,
    Note,
    PlanFor,
    ProviderCount,
    Recount,
    Recounted,
    Reject,
    Relay,
    Remember,
    Render,
    Reply,
    Routed,
    Send,
    Summarise,
    Summary,
)
from proxy.core.learning.corrections import Correction, CorrectionPolicy, Overflow, parse_overflow
from proxy.core.plan import Plan
from proxy.core.trimming.compaction import summary_request, with_summary

Mode = Literal["enforce", "dry_run", "off"]
DEFAULT_POLICY = CorrectionPolicy()
BACKEND_ROUNDS = 3  # re-plans after the backend counted what a trim produced; one is usually enough


class Exchange:
    """One request's exchange. `start()` gives the first command, `send(reply)` the next one (None
    when the exchange is over). The attributes say where it stands, for the request's record."""

    def __init__(
        self,
        mode: Mode,
        *,
        read_whole: bool = True,
        chat: Mapping[str, Any] | None = None,
        self_correct: CorrectionPolicy | None = DEFAULT_POLICY,
        holds: tuple[bool, bool] = (False, False),
    ) -> None:
        self.mode = mode
        # Whether the request names context the provider holds, and whether it asked the provider
        # to truncate what does not fit (`truncation: "auto"`).
        self.holds, self.provider_truncates = holds
        # Whether the request's count covered everything the upstream may put in its prompt: only
        # then is a count factor its error implies about the model, not about this request.
        self.read_whole = read_whole
        self.chat = chat  # the chat view, when a summary may replace what a cut dropped
        self._policy = self_correct if mode == "enforce" else None  # None: never retry
        # Decided from the route's, the tokenizer's and the correction's replies (`_decided`):
        self.known_window = 0  # the window the serving model runs with (a larger one the request opts into)
        self.window: int | None = None  # the window the request opted into, when not the model's own (None: its own)
        self.window_source: str | None = None  # where the window came from, for the record
        self.applied: Correction | None = None  # a correction learned earlier, applied to this request's window
        self.provider: str | None = None  # the upstream's kind, named in a correction; None: as its error's words say
        self.recounts = False  # the backend's own tokenizer counts: recount what a trim produced
        self.provider_counts = False  # the upstream's count endpoint may decide at the budget's edge
        self.plan: Plan | None = None  # the latest plan
        self.attempt = 0
        self.learned: Correction | None = None  # measured from this request's upstream error
        self.ignored_overflow: str | None = None  # why an overflow error taught nothing
        self.overflow: Overflow | None = None  # the upstream's overflow error, as read, if one came
        self.held: Held | None = None  # what the held context weighs, once looked up
        self.held_tokens = 0  # counted with every plan, never cut
        self._steps = self._run()

    def start(self) -> Command:
        return next(self._steps)

    def send(self, reply: Reply) -> Command | None:
        try:
            return self._steps.send(reply)
        except StopIteration:
            return None

    def _run(self) -> Generator[Command, Any, None]:
        yield from self._decided()
        self.attempt = 1
        if self.mode == "off":
            answered = yield Send(None, None)
            if isinstance(answered, Answered):
                self._overflowed(answered)
                yield Relay()
            return
        window = min(self.applied.window, self.known_window) if self.applied else self.window
        plan = yield from self._first_plan(window)
        # Once, on the first plan, when it is a bound: the provider's own count at the budget's edge
        # (not with held context counted in: some count endpoints leave it out, e.g. Gemini's cache).
        if self.provider_counts and not plan.count.exact and not self.held_tokens:
            counted: Plan | None = yield ProviderCount(plan)
            plan = plan if counted is None else counted
        while True:
            plan = yield from self._recounted(plan)
            plan = yield from self._summarised(plan)
            self.plan = plan
            decision = self._decide(plan)
            if isinstance(decision, Reject) and self.provider_truncates and self.held_tokens:
                # What the provider holds does not fit, and the client asked it to drop the oldest.
                yield Note("provider_truncates")
                decision = Send(None, plan, self.attempt, "forwarded_provider_truncates")
            if isinstance(decision, Reject):
                kept = self._refused_retry()
                if kept is not None:
                    yield Remember(kept)
                yield decision
                return
            reply = yield decision
            if isinstance(reply, Delivered):
                correction = self._succeeded() if reply.whole else None
                if correction is not None:
                    yield Remember(correction)
                return
            assert isinstance(reply, Answered), reply
            retry = yield from self._corrected(plan, reply)
            if retry is None:
                yield Relay()
                return
            plan = retry

    def _decided(self) -> Generator[Command, Any, None]:
        """The window, the tokenizer and the correction, decided from what the server found: the
        route's window, or a larger one the request opts into where the window is the model map's
        (Anthropic's 1M beta header); the backend's tokenizer asked when the route does not know
        how the request is counted; a correction learned earlier, whose window applies instead
        (`_run`: never looser than the one known). Under `mode: off` too: the record says what
        the request would have been counted with."""
        routed: Routed = yield FIND_ROUTE
        opted = routed.opt_in_window if routed.window_source == "model_map" else None
        larger = opted if opted is not None and opted > routed.context_window else None
        self.known_window, self.window = larger or routed.context_window, larger
        self.window_source = routed.window_source if larger is None else "opt_in"
        self.provider = routed.provider  # the provider a correction names
        chosen: Chosen = routed.chosen if routed.chosen is not None else (yield CHOOSE_TOKENIZER)
        self.recounts = chosen.recounts  # nothing to count again without the backend's tokenizer
        # Bounds straddling the budget: the upstream counts (the backend's own tokenizer needs none).
        self.provider_counts = chosen.source != "backend" and routed.provider_counts
        correction: Correction | None = yield LOOK_UP_CORRECTION
        if correction is not None:
            self.applied, self.window_source = correction, "correction"
        if self.window_source == "fallback":  # neither the config, the map, the server nor a correction knew it
            yield Note("fallback_window")
        if routed.vocabulary_missing is not None:  # counted with the family's bound
            yield Note(f"vocabulary_missing:{routed.vocabulary_missing}")

    def _first_plan(self, window: int | None) -> Generator[Command, Any, Plan]:
        """The first plan, counting what the provider holds for the request with what was sent:
        the held size the server found; or, where the provider counted the whole request, the
        difference between its count and the count of what was sent (never below nothing)."""
        if self.holds:
            held: Held = yield LOOK_UP_HELD
            self.held = held
            self.held_tokens = held.tokens or 0
            if (held.tokens is None and held.whole is None) or held.source == "partial":  # counted as sent, or in part
                yield Note(f"held_{held.source}")
        first = PlanFor(window, held=self.held_tokens) if window is not None or self.held_tokens else FOR_MODEL_WINDOW
        plan: Plan = yield first
        whole = self.held.whole if self.held is not None else None
        if whole is not None and whole > plan.count.total:
            self.held_tokens = whole - plan.count.total
            plan = yield PlanFor(window, held=self.held_tokens)
        return plan

    def _decide(self, plan: Plan) -> Send | Reject:
        result = plan.result
        if self.mode != "enforce":
            return Send(None, plan, self.attempt, f"dry_run_{result.outcome}")
        if result.outcome == "rejected":
            return Reject(plan)
        return Send(plan.request if result.changed or plan.rewritten else None, plan, self.attempt, result.outcome)

    def _recounted(self, plan: Plan) -> Generator[Command, Any, Plan]:
        """With the backend's tokenizer, what the trim produced (a shortened message, its marker, a
        note) is counted by the backend too, and the body to send counted again: within the budget,
        that exact count stands (the cut was made on estimates of the shortened text); over it, the
        request is re-planned with the new counts. The shortening tries new pieces of text each
        time, so this need not converge: the last plan counts what the backend has not counted by
        an upper bound (its bytes). If the backend's count of that plan is still over the budget (a
        cut made by estimated token positions), it goes out with that count and the note
        `backend_count_over_budget`; the window's margin and, past it, self-correction take it from
        there. A count reported is never under the backend's."""
        if not self.recounts:
            return plan
        for round_ in range(BACKEND_ROUNDS + 1):
            recounted: Recounted | None = yield Recount(plan.request)
            if recounted is None:
                break
            yield Note("estimate", present=False)  # said again below, or by the re-made plan, when still true
            tokens = recounted.tokens + self.held_tokens if recounted.tokens is not None else None
            if tokens is not None and tokens <= plan.result.budget.input_budget:
                if not plan.count.exact:
                    yield Note("estimate")
                return replace(plan, result=replace(plan.result, tokens_after=tokens))
            if round_ == BACKEND_ROUNDS:
                if tokens is not None:  # the backend's own count, over the budget: said, not hidden
                    yield Note("backend_count_over_budget")
                    return replace(plan, result=replace(plan.result, tokens_after=tokens))
                break
            window, last = plan.result.budget.context_window, round_ == BACKEND_ROUNDS - 1
            plan = yield PlanFor(window, bound_unfetched=last, held=self.held_tokens)
        return plan

    def _summarised(self, plan: Plan) -> Generator[Command, Any, Plan]:
        """With `trim.summarize_dropped` (`chat` given), an enforced cut has a summary of what it
        dropped put in its place (produced by the summariser, or reused from its cache); as it was
        when there is none."""
        if self.chat is None or self.mode != "enforce" or not plan.result.changed or plan.counter is None:
            return plan
        request = summary_request(self.chat, plan.result)
        if request is None:
            return plan
        summary: Summary = yield Summarise(request)
        view = with_summary(plan.result, request, summary.text, summary.status, plan.counter)
        body: Mapping[str, Any] = yield Render(view)
        return replace(plan, result=view, body=body)

    def _corrected(self, plan: Plan, answered: Answered) -> Generator[Command, Any, Plan | None]:
        """The plan for a retry after the upstream's error, or None: relay the error as it came."""
        overflow = self._overflowed(answered)
        if self._policy is None or self.attempt > 1 or overflow is None:
            return None
        if self.provider is not None:  # llama-cpp-python words its errors as OpenAI does
            overflow = replace(overflow, provider=self.provider)
        budget = plan.result.budget
        correction = Correction.measure(  # from the known window: corrections never compound
            overflow, plan.result.tokens_after, self.known_window, budget.output_reserve, self._policy
        )
        if correction is None:
            self.ignored_overflow = "implausible"
            return None
        self.learned = correction
        # Never looser than what overflowed.
        retry: Plan = yield PlanFor(min(correction.window, budget.context_window), held=self.held_tokens)
        if retry.result.outcome not in ("trimmed", "rejected"):
            # `overflow: forward` and still too long, or nothing the guard can cut: sending it again cannot help.
            self.ignored_overflow = "not_retried"
            return None
        self.attempt = 2
        return retry

    def _overflowed(self, answered: Answered) -> Overflow | None:
        """The overflow the upstream's error describes (kept for the record), or None."""
        overflow = parse_overflow(answered.status, answered.error_body, answered.sent)
        if overflow is not None:
            self.overflow = overflow
        return overflow

    def _succeeded(self) -> Correction | None:
        """The correction to remember for the model, if a retry won (of a request not read whole or
        counted with an estimate, only the window the provider stated)."""
        if self.attempt != 2 or self.learned is None:
            return None
        # A count with an estimated part (media, an opaque item) fell short for this request's parts.
        whole = self.read_whole and not (self.plan is not None and self.plan.count.estimated)
        return self.learned if whole else self.learned.limit_only(self.known_window)

    def _refused_retry(self) -> Correction | None:
        """The correction to remember when the guard refused the retry: the smaller window the
        provider stated could not hold what may not be cut with its output reserve. No retry
        proved it, so only what the provider stated is kept (the window it names, smaller than
        the one known), never a count factor: without it every later request of the model would
        be sent for the window the provider has just refused."""
        if self.attempt != 2 or self.learned is None:
            return None
        return self.learned.limit_only(self.known_window)
