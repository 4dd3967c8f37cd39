"""The plan of a body sent again as it was, kept with the earlier body it repeats.

A retry, or a regenerated answer, sends the very bytes of an earlier request. The prefix reader
knows when it does (`proxy.wire.prefix_reader`: the reading's `KnownPrefix.same` is the earlier
body), and the plan made for those bytes, for the same client, model, window, tokenizer and
policy, is the plan for these: counting them again would find every count in the cache and reach
the same decision, at about 0.2 ms a request on an 88 KB conversation.

A plan is kept only while the prefix reader keeps the body it was made for (a weak reference: the
reader's memory bound is this one's too), at most `PER_BODY` plans per body, and only a plan that
cut nothing: a cut plan carries the counter that counts a summary put in later, which is one
request's own. Kept per client, as the count cache is, so that one client's timing cannot tell
it what another sent. Each use is noted on the plan's timings: the count took the lookup's time,
the trim none.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable
from dataclasses import replace

from proxy.apis.base import Fitted, Parsed
from proxy.core.plan import Plan

PER_BODY = 8  # plans kept per body: a few clients, windows or tokenizers


class ResentPlans:
    """Plans of bodies sent again, by the earlier body and what else the plan depended on."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        # The plan alone is kept, not the `Fitted` (whose request names the earlier body: the body
        # would then never be let go).
        self._plans: weakref.WeakKeyDictionary[object, dict[Hashable, Plan]] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()  # plans are made on the loop and in threads

    def fitted(self, parsed: Parsed, key_of: Callable[[], Hashable], make: Callable[[], Fitted]) -> Fitted:
        """The plan kept for `parsed`'s earlier body and `key_of()` (what else the plan depended
        on), for `parsed`; else `make()`, kept when it may be. A body not sent before is only
        made: its key is never worked out."""
        same = parsed.same_as() if parsed.same_as is not None else None
        if same is None:
            return make()
        started = self._clock()
        key = key_of()
        with self._lock:
            kept = self._plans.get(same, {}).get(key)
        if kept is not None:
            seconds = self._clock() - started
            return Fitted(parsed, replace(kept, body=parsed.body, count_seconds=seconds, trim_seconds=0.0), parsed.body)
        fitted = make()
        if not fitted.plan.result.changed:
            with self._lock:
                plans = self._plans.setdefault(same, {})
                if len(plans) < PER_BODY:
                    plans[key] = fitted.plan
        return fitted

    def __len__(self) -> int:
        with self._lock:
            return sum(len(plans) for plans in self._plans.values())
