"""The canonical path's route carries the endpoint it was matched to, so the handler never looks it up again."""

from __future__ import annotations

from proxy.apis.registry import AdapterRegistry
from proxy.server.edge.local_paths import local_name
from proxy.server.edge.paths import PassthroughPolicy, canonical_path, route_for

REGISTRY = AdapterRegistry()


def route(path: str, method: str = "POST"):
    return route_for(canonical_path(path), method, PassthroughPolicy(), REGISTRY.endpoint_for, local_name)


class TestRouteEndpoint:
    def test_a_counted_path_carries_its_adapter(self):
        chat = route("/v1/chat/completions")
        assert chat.kind == "guarded" and chat.api == "chat" and chat.endpoint is not None
        assert chat.endpoint.adapter is REGISTRY.by_name("chat")

    def test_an_azure_deployment_path_carries_the_model_it_names(self):
        azure = route("/openai/deployments/my-gpt4o/chat/completions")
        assert azure.endpoint is not None and azure.endpoint.path_model == "my-gpt4o"

    def test_the_local_count_tokens_endpoint_is_routed_as_count_tokens(self):
        counted = route("/v1/messages/count_tokens")
        assert counted.api == "count_tokens" and counted.endpoint is not None and counted.endpoint.local

    def test_a_path_no_adapter_counts_carries_no_endpoint(self):
        forwarded = route("/v1/models")
        assert forwarded.kind == "forward" and forwarded.endpoint is None

    def test_every_route_carries_its_paths_segments_whatever_its_kind(self):
        """Counted, answered here or forwarded, a route's segments are its path's, split once."""
        for path, kind in [("/v1beta/models/gemini-2.5-flash:generateContent", "guarded"), ("/healthz", "local"),
                           ("/v1/models", "forward")]:  # fmt: skip
            found = route(path, "GET" if kind == "local" else "POST")
            assert found.kind == kind and found.segments == tuple(s for s in path.split("/") if s)
