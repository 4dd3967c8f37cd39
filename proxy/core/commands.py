"""What the exchange asks the server, and what the server answers: one frozen dataclass each.

`proxy.core.exchange.Exchange` yields a command and is sent its reply; each command's docstring
names the reply. The first four work out what the request is counted with (its route, the
tokenizer, a correction learned earlier, what the context the provider holds for it weighs); the
exchange decides from their replies, the server only looks things up and asks. The rest plan,
count, send and answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.core.learning.corrections import Correction
from proxy.core.plan import Plan
from proxy.core.trimming.budget import SummaryStatus, TrimResult
from proxy.core.trimming.compaction import SummaryRequest


@dataclass(frozen=True, slots=True)
class FindRoute:
    """Find where the request's model goes and what it is counted with: the route kept for the
    model, else worked out now (asking the upstream for the served model's window, loading its
    vocabulary). Reply: `Routed`."""


@dataclass(frozen=True, slots=True)
class Chosen:
    """How the request is counted: `source` is the log's `count_source` (`backend`: the server's
    own tokenizer, `model`: the model's exact one, `calibrated`, `estimate`); `recounts`: the
    backend's tokenizer counts again what a trim produced."""

    source: str
    recounts: bool = False


@dataclass(frozen=True, slots=True)
class Routed:
    """What the model's route says of the request: the window the serving model runs with and
    where it came from (the config, the model map, the server, `fallback`); the larger window the
    request opts into by a header, when it names one (None: none); the vocabulary package that is
    not installed (counted with the family's bound); the provider a learned correction names (the
    upstream's provider says it, from what discovery found; None: none); whether the upstream's count
    endpoint may decide at the budget's edge; and how the request is counted, when the route knows
    it already (None: `ChooseTokenizer`)."""

    context_window: int
    window_source: str
    opt_in_window: int | None = None
    vocabulary_missing: str | None = None
    provider: str | None = None
    provider_counts: bool = False
    chosen: Chosen | None = None


@dataclass(frozen=True, slots=True)
class ChooseTokenizer:
    """Ask whether the backend's own tokenizer counts this request (it may count the body now),
    else the model's own or an estimate. Reply: `Chosen`."""


@dataclass(frozen=True, slots=True)
class LookUpCorrection:
    """The correction learned earlier for the upstream and the served model, kept here or shared
    between replicas. Reply: the `Correction`, or None."""


@dataclass(frozen=True, slots=True)
class LookUpHeld:
    """What the context the provider holds for this request weighs (the stored response, the
    conversation, the cache it names by id): from the ledger of answers the guard relayed, else
    from the provider's own count. Reply: `Held`."""


@dataclass(frozen=True, slots=True)
class Held:
    """What the held context weighs: `tokens` (None: unknown), where that came from (`ledger`,
    `provider`, `unknown`); or, when the provider's count endpoint counted the whole request
    instead (held and sent together), that count as `whole`."""

    tokens: int | None
    source: str
    whole: int | None = None


@dataclass(frozen=True, slots=True)
class PlanFor:
    """Count and trim the request for `window` (None: the model's own), written back in its API's
    shape; `held`: tokens the provider adds from what it holds, counted with what was sent but
    never cut; with `bound_unfetched`, texts the backend has not counted are bounded from above
    from now on (the last plan must not undercount because an estimate ran low). Reply: the `Plan`."""

    window: int | None
    bound_unfetched: bool = False
    held: int = 0


@dataclass(frozen=True, slots=True)
class ProviderCount:
    """Where `plan`'s bounds straddle its budget, ask the upstream's own count endpoint
    (`proxy.core.counting.edge`). Reply: the plan as that count re-makes it (the request as sent, when the
    provider's count fits), or None: `plan` stands."""

    plan: Plan


@dataclass(frozen=True, slots=True)
class Recount:
    """Have the backend count `body` (fetching the counts of texts it has not seen). Reply:
    `Recounted`, or None when the backend cannot count now."""

    body: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Recounted:
    tokens: int | None  # `body` as the backend counts it; None: some of it is still counted locally


@dataclass(frozen=True, slots=True)
class Summarise:
    """Ask the summariser for a summary of the span `request` names. Reply: `Summary`."""

    request: SummaryRequest


@dataclass(frozen=True, slots=True)
class Summary:
    text: str | None
    status: SummaryStatus


@dataclass(frozen=True, slots=True)
class Render:
    """Write the cut `view` (in the chat view) back in the API's own shape. Reply: the body."""

    view: TrimResult


@dataclass(frozen=True, slots=True)
class Note:
    """Say `name` on the request's log line (or, with `present` False, no longer say it). Reply: None."""

    name: str
    present: bool = True


@dataclass(frozen=True, slots=True)
class Send:
    """Send the request: `body` when the guard changed it, else the bytes as received. `outcome`
    is what the log says of it. Reply: `Delivered` or `Answered`."""

    body: Mapping[str, Any] | None
    plan: Plan | None
    attempt: int = 1
    outcome: str = "forwarded"


@dataclass(frozen=True, slots=True)
class Delivered:
    """The upstream accepted the request and its answer was relayed; `whole`: the client had all of
    it (it did not hang up, the stream did not break), so what the attempt taught may be kept."""

    whole: bool = True


@dataclass(frozen=True, slots=True)
class Answered:
    """The upstream answered `status` >= 400 (or a stream with no answer in it) with `error_body`
    to the bytes `sent`."""

    status: int
    error_body: bytes
    sent: bytes


@dataclass(frozen=True, slots=True)
class Reject:
    """Answer 400 context_length_exceeded: nothing more may be cut."""

    plan: Plan


@dataclass(frozen=True, slots=True)
class Relay:
    """Give the client the upstream's own answer (the one `Answered` described)."""


@dataclass(frozen=True, slots=True)
class Remember:
    """Keep `correction` for the upstream and model: a retry planned with it was accepted. Reply: None."""

    correction: Correction


FOR_MODEL_WINDOW = PlanFor(None)  # most requests' first plan, made once
FIND_ROUTE, CHOOSE_TOKENIZER, LOOK_UP_CORRECTION = FindRoute(), ChooseTokenizer(), LookUpCorrection()
LOOK_UP_HELD = LookUpHeld()
DELIVERED, DELIVERED_IN_PART = Delivered(whole=True), Delivered(whole=False)

Command = (
    FindRoute
    | ChooseTokenizer
    | LookUpCorrection
    | LookUpHeld
    | PlanFor
    | ProviderCount
    | Recount
    | Summarise
    | Render
    | Note
    | Send
    | Remember
    | Reject
    | Relay
)
Reply = (
    Routed | Chosen | Correction | Held | Plan | Recounted | Summary | Mapping[str, Any] | Delivered | Answered | None
)
