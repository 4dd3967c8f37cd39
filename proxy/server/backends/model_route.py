"""A model's route worked out (`model_route`), at the first request of a model and API and
whenever the kept one no longer holds (`proxy.server.backends.models.ModelRoutes`).

Every request names a model; from it the guard works out the upstream it goes to, the model that
serves it, that model's profile (its window: the config's, the model map's, or the one the server
states), the tokenizer to count with and how it was chosen, the upstream's kind of backend and
the budget policy that follows from it (`ModelRoute`). None of that depends on the request, so
the route is kept and read back by every later request of the model (what is not kept, and why:
`proxy.server.backends.models`).
"""

from __future__ import annotations

import asyncio
import dataclasses

from proxy.core.commands import Routed
from proxy.server.backends.catalogue import Backends
from proxy.server.backends.models import ModelRoute, Models, Target, chosen_of, counted_with
from proxy.server.backends.profiles import budget_policy
from proxy.tokenizers.map_corrections import correction_for


async def model_route(
    models: Models, counting: Backends, model: str, target: Target, stated: int | None
) -> tuple[ModelRoute, bool]:
    """The route of `model` to `target`, worked out now with the gateway's `models` and
    `counting`, `stated` being the window the upstream runs the served model with when it says
    one (`Backends.known_window`, or asked by the caller); and whether a vocabulary had to load
    on the way, which is not kept."""
    upstream = target.upstream
    served = target.model or model
    # The budget follows the model that will serve the request: after a rename, the target's window.
    profile = models.profile(served)
    window_source: str = profile.window_source
    map_correction = correction_for(profile)
    asked = False
    if stated:  # the window the server itself runs the model with (vLLM, llama.cpp, Ollama)
        profile, window_source = dataclasses.replace(profile, context_window=stated), "backend"
    local = models.tokenizers.loaded_by_spec.get(profile.tokenizer)
    if local is None:  # a vocabulary not loaded yet (about a second) loads off the loop
        local, asked = await asyncio.to_thread(models.tokenizer, profile), True
    backend = counting.profile_of(upstream.name)
    choice = counting.local_choice(upstream.name, served, profile, local)
    missing = models.tokenizers.vocabulary_missing(profile.tokenizer)
    routed = Routed(
        profile.context_window,
        window_source,
        vocabulary_missing=missing,
        # The provider a correction names: the upstream's own name for it, else what discovery found it to be.
        provider=upstream.provider.corrections_name or (backend.kind if backend.named_in_corrections else None),
        provider_counts=upstream.provider_count,
        chosen=None if choice is None else chosen_of(choice),
    )
    budget = budget_policy(backend, models.policy.budget, counting.options_for(upstream.name).min_output_tokens)
    route = ModelRoute(
        target=target,
        served=served,
        profile=profile,
        window_source=window_source,
        override=models.override_pattern(served),
        map_correction=map_correction,
        local=local,
        vocabulary_missing=missing,
        choice=choice,
        backend=backend,
        budget=budget,
        discovery=counting.discoveries.get(upstream.name),
        routed=routed,
        counted=None if choice is None else counted_with(choice, upstream, served, budget),
        calibrated_at=counting.calibration.version,
    )
    return route, asked
