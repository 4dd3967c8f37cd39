"""The life of one guarded request as a pure state machine: plan, forward, read the outcome,
correct, re-plan. The server performs the I/O each decision asks for and feeds the outcome back;
nothing here awaits, sends or logs (mitmproxy's layers work the same way).

    attempts = Attempts(planner, mode="enforce", ...)
    decision = attempts.start()                         # Forward(...) or Reject(...)
    ... the server sends decision.body (or the raw bytes when body is None) ...
    decision = attempts.upstream_failed(status, error_body, sent)   # Relay, Forward (retry) or Reject
    correction = attempts.succeeded()                   # a correction to commit, when a retry won

`planner(window)` counts and trims the request for a context window (None: the model's own).
At most one retry, and only when the upstream's own error says the context was exceeded in a
plausible way; see `proxy.core.corrections`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from proxy.core.corrections import Correction, CorrectionPolicy, parse_overflow
from proxy.core.plan import Plan

Mode = Literal["enforce", "dry_run", "off"]
DEFAULT_POLICY = CorrectionPolicy()


@dataclass(frozen=True, slots=True)
class Forward:
    """Send the request: `body` when the guard changed it, else the bytes as received."""

    body: Mapping[str, Any] | None
    plan: Plan | None
    attempt: int = 1


@dataclass(frozen=True, slots=True)
class Reject:
    """Answer 400 context_length_exceeded: nothing more may be cut."""

    plan: Plan


@dataclass(frozen=True, slots=True)
class Relay:
    """Give the client the upstream's own answer."""


Decision = Forward | Reject | Relay


class Attempts:
    def __init__(
        self,
        planner: Callable[[int | None], Plan],
        mode: Mode,
        *,
        known_window: int,
        correction: Correction | None = None,
        self_correct: CorrectionPolicy | None = DEFAULT_POLICY,
        provider: str | None = None,
        read_whole: bool = True,
    ) -> None:
        self._planner = planner
        # Whether the request's count covered everything the upstream may put in its prompt: only
        # then is a count factor its error implies about the model, not about this request.
        self.read_whole = read_whole
        self.provider = provider  # the upstream's kind, named in a correction; None: as its error's wording says
        self.mode = mode
        self.known_window = known_window
        self.applied = correction  # a correction learned earlier, applied to this request's window
        self._policy = self_correct if mode == "enforce" else None  # None: never retry
        self.plan: Plan | None = None  # the latest plan
        self.attempt = 0
        self.learned: Correction | None = None  # measured from this request's upstream error
        self.ignored_overflow: str | None = None  # why an overflow error taught nothing

    def start(self) -> Forward | Reject:
        self.attempt = 1
        if self.mode == "off":
            return Forward(None, None)
        window = min(self.applied.window, self.known_window) if self.applied else None
        self.plan = self._planner(window)
        return self._decide(self.plan)

    def _decide(self, plan: Plan) -> Forward | Reject:
        result = plan.result
        if self.mode != "enforce":
            return Forward(None, plan, self.attempt)
        if result.outcome == "rejected":
            return Reject(plan)
        return Forward(result.body if result.changed else None, plan, self.attempt)

    def revised(self, plan: Plan) -> Forward | Reject:
        """The current attempt re-decided on `plan` (the same request, now with the summary of what
        was dropped put in its place)."""
        self.plan = plan
        return self._decide(plan)

    def upstream_failed(self, status: int, error_body: bytes, sent: bytes) -> Decision:
        """The upstream answered `status` >= 400 with `error_body` to the bytes `sent`."""
        plan = self.plan
        if self._policy is None or plan is None or self.attempt > 1:
            return Relay()
        overflow = parse_overflow(status, error_body, sent)
        if overflow is None:
            return Relay()
        if self.provider is not None:  # llama-cpp-python words its errors as OpenAI does
            overflow = replace(overflow, provider=self.provider)
        budget = plan.result.budget
        correction = Correction.measure(  # from the known window: corrections never compound
            overflow,
            plan.result.tokens_after,
            self.known_window,
            budget.output_reserve,
            self._policy,
        )
        if correction is None:
            self.ignored_overflow = "implausible"
            return Relay()
        self.learned = correction
        retry = self._planner(min(correction.window, budget.context_window))  # never looser than what overflowed
        if retry.result.outcome not in ("trimmed", "rejected"):
            # `overflow: forward` and still too long, or nothing the guard can cut: sending it again cannot help.
            self.ignored_overflow = "not_retried"
            return Relay()
        self.plan, self.attempt = retry, 2
        return self._decide(retry)

    def succeeded(self) -> Correction | None:
        """The upstream accepted the latest attempt: the correction to remember for the model, if a
        retry won (of a request not read whole, only the window the provider stated)."""
        if self.attempt != 2 or self.learned is None:
            return None
        return self.learned if self.read_whole else self.learned.limit_only(self.known_window)
