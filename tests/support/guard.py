"""Planning a chat-completions body with a `Models` directly, as the package once did in
`Models.plan`: the core's plan with the guard's profile, tokenizer, cache and policy, without an
adapter or a server. Tests and the real-backend bench compare counts with it."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from proxy.apis.fitting import Counting
from proxy.core.counting.request_count import RequestCounter
from proxy.core.plan import Plan, plan_request
from proxy.server.backends.models import Models


def plan_with(
    guard: Models,
    body: Mapping[str, Any],
    model: str,
    context_window: int | None = None,
    counting: Counting | None = None,
) -> Plan:
    """Count and trim `body` for `model`. `counting` replaces the model's own profile and tokenizer
    (the shared cache counts only with the profile's own loaded tokenizer: `Models._counting`)."""
    profile, tokenizer, cache = guard._counting(model, counting)
    return plan_request(body, RequestCounter(profile, tokenizer, cache), guard.policy, context_window, time.perf_counter)
