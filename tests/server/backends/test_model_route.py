"""What a model's requests are counted and sent with is worked out once per model and API, and
kept only while nothing it came from can have changed (proxy/server/backends/models.py, worked out by model_route.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from proxy.config.settings import load_settings
from proxy.core.counting.tokenizer import CharEstimateTokenizer
from proxy.server.backends.catalogue import Backends, Choice
from proxy.server.backends.model_route import model_route
from proxy.server.backends.models import MAX_ROUTES, ModelRoute, ModelRoutes, Models, Router
from proxy.server.backends.profiles import Discovery

CONFIG = """\
upstreams:
  openai:
    base_url: http://127.0.0.1:9/v1
  local:
    base_url: http://127.0.0.1:9/v1
routes:
  - match: served-locally
    upstream: local
    rename: gpt-4o-mini
  - match: "*"
    upstream: openai
"""


class CountedModels(Models):
    """The gateway's `Models`, saying how often a model's profile was looked up."""

    looked_up = 0

    def profile(self, model: str) -> Any:
        self.looked_up += 1
        return super().profile(model)


@pytest.fixture
def gateway_parts(tmp_path: Path) -> tuple[CountedModels, Backends, Router]:
    path = tmp_path / "context-guard.yaml"
    path.write_text(CONFIG)
    settings = load_settings(path)
    return CountedModels(settings), Backends(), Router(settings)


async def route_of(parts: tuple[CountedModels, Backends, Router], model: str) -> tuple[ModelRoute, bool]:
    models, backends, router = parts
    target = router.route(model)
    known, stated = backends.known_window(target.upstream.name, target.model or model)
    assert known, "nothing is asked of an upstream not discovered"
    return await model_route(models, backends, model, target, stated)


class TestWorkingItOut:
    async def test_a_route_is_the_served_model_its_window_and_its_own_exact_tokenizer(self, gateway_parts):
        _, loading = await route_of(gateway_parts, "served-locally")
        route, asked = await route_of(gateway_parts, "served-locally")
        assert loading and not asked  # the first loaded the vocabulary: that one is not kept
        assert route.target.upstream.name == "local" and route.served == "gpt-4o-mini"
        assert route.profile.name == "gpt-4o-mini" and route.profile.context_window == 128_000
        assert route.window_source == "model_map" and route.override is None
        assert route.choice is not None and route.choice.source == "model" and route.choice.tokenizer is route.local
        assert route.kept_as_is

    async def test_a_window_the_server_states_is_the_route_s(self, gateway_parts):
        _, backends, _ = gateway_parts
        backends.discoveries["openai"] = Discovery("vllm", default_window=8192)
        route, _ = await route_of(gateway_parts, "gpt-4o")
        assert route.profile.context_window == 8192 and route.window_source == "backend"
        assert route.discovery is backends.discoveries["openai"]


class TestKeeping:
    async def test_a_model_s_later_requests_read_back_what_its_first_worked_out(self, gateway_parts):
        models, backends, _ = gateway_parts
        routes = ModelRoutes()
        first, _ = await route_of(gateway_parts, "gpt-4o")
        routes.put("gpt-4o", "chat", first)
        looked_up = models.looked_up
        for _ in range(3):
            assert routes.get("gpt-4o", "chat", backends) is first
        assert models.looked_up == looked_up
        assert routes.get("gpt-4o", "responses", backends) is None  # per API
        assert routes.get("gpt-4o-mini", "chat", backends) is None

    async def test_a_route_is_not_read_back_once_its_upstream_was_discovered_again(self, gateway_parts):
        _, backends, _ = gateway_parts
        backends.discoveries["openai"] = Discovery("vllm", default_window=8192)
        routes = ModelRoutes()
        route, _ = await route_of(gateway_parts, "gpt-4o")
        routes.put("gpt-4o", "chat", route)
        assert routes.get("gpt-4o", "chat", backends) is route
        backends.discoveries["openai"] = Discovery("vllm", default_window=4096)
        assert routes.get("gpt-4o", "chat", backends) is None
        again, _ = await route_of(gateway_parts, "gpt-4o")
        assert again.profile.context_window == 4096

    async def test_a_choice_the_backend_makes_per_body_is_worked_out_anew_for_every_request(self, gateway_parts):
        """No choice at all means the backend's own tokenizer counts each body."""
        route, _ = await route_of(gateway_parts, "gpt-4o")
        moving = ModelRoute(**{**_fields(route), "choice": None})
        routes = ModelRoutes()
        routes.put("gpt-4o", "chat", moving)
        assert not moving.kept_as_is and len(routes) == 0

    @pytest.mark.parametrize("source", ["calibrated", "estimate"])
    async def test_an_estimate_is_read_back_until_calibration_learns_something(self, gateway_parts, source):
        """A calibrated estimate's factor moves with what is learned: once the table learned
        anything, the route read back has its choice made anew, and nothing else worked out again."""
        models, backends, _ = gateway_parts
        route, _ = await route_of(gateway_parts, "gpt-4o")
        choice = Choice(route.profile, CharEstimateTokenizer(4.0), source)
        estimated = ModelRoute(**{**_fields(route), "choice": choice})
        routes = ModelRoutes()
        routes.put("gpt-4o", "chat", estimated)
        assert routes.get("gpt-4o", "chat", backends) is estimated
        looked_up = models.looked_up
        backends.calibration.observe("openai", "gpt-4o-mini", 1_300, 1_000)  # any model's: the table moved
        again = routes.get("gpt-4o", "chat", backends)
        assert again is not None and again.choice is not None and again.choice is not choice
        assert again.choice.source == "model" and again.routed.chosen is not None  # gpt-4o's own tokenizer
        assert again.counted is not None and again.counted.tokenizer is again.choice.tokenizer
        assert (again.profile, again.target, models.looked_up) == (route.profile, route.target, looked_up)
        assert routes.get("gpt-4o", "chat", backends) is again

    async def test_a_claude_route_s_choice_follows_what_calibration_learns(self, gateway_parts):
        models, backends, _ = gateway_parts
        backends.calibration.observe("openai", "claude-sonnet-4-5", 1_300, 1_000)
        route, _ = await route_of(gateway_parts, "claude-sonnet-4-5")
        assert route.choice is not None and route.choice.source == "calibrated"
        routes = ModelRoutes()
        routes.put("claude-sonnet-4-5", "messages", route)
        assert routes.get("claude-sonnet-4-5", "messages", backends) is route
        backends.calibration.observe("openai", "claude-sonnet-4-5", 1_600, 1_000)
        looked_up = models.looked_up
        again = routes.get("claude-sonnet-4-5", "messages", backends)
        assert again is not None and again.choice is not None and models.looked_up == looked_up
        text = "word " * 200
        assert again.choice.tokenizer.count(text) > route.choice.tokenizer.count(text)
        assert again.counted is not None and again.counted.tokenizer is again.choice.tokenizer

    async def test_how_many_models_are_remembered_is_bounded_whatever_names_clients_send(self, gateway_parts):
        _, backends, _ = gateway_parts
        route, _ = await route_of(gateway_parts, "gpt-4o")
        routes = ModelRoutes()
        for i in range(MAX_ROUTES + 10):
            routes.put(f"gpt-4o-{i}", "chat", route)
        assert len(routes) == MAX_ROUTES
        assert routes.get("gpt-4o-5", "chat", backends) is None  # the oldest went
        assert routes.get(f"gpt-4o-{MAX_ROUTES + 5}", "chat", backends) is route  # the newest are kept


def _fields(route: ModelRoute) -> dict[str, Any]:
    return {name: getattr(route, name) for name in ModelRoute.__dataclass_fields__}
