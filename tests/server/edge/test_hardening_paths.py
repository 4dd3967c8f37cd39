"""One canonical path decides the route and the upstream URL; pass-through is by policy."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from proxy.apis.registry import AdapterRegistry
from proxy.server.backends.models import Models
from proxy.server.edge.paths import (
    CanonicalPath,
    InvalidPath,
    PassthroughPolicy,
    canonical_path,
    upstream_url,
)
from proxy.server.process.app import ROUTES_KEPT, create_app
from proxy.server.request.gateway import GATEWAY
from tests.server.conftest import gateway_settings
from tests.server.raw_http import raw_request
from tests.support.upstream import FakeUpstream

HI = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()
JSON = {"Content-Type": "application/json"}

CHAT_SPELLINGS = [
    "/v1/chat/completions",
    "/chat/completions",
    "/v1/chat/./completions",
    "/v1/chat/x/../completions",
    "/v1/chat/%2e/completions",
    "/v1/chat/%2E%2E/chat/completions",
    "/v1//chat/completions",
    "//v1/chat//completions",
    "/v1/chat/completions/",
    "/v1/chat/complet%69ons",
    "/./v1/chat/completions",
    "/v1/chat/completions?api-version=1",
]
AMBIGUOUS = [
    ("/v1/chat%2Fcompletions", "encoded '/'"),
    ("/v1/chat%2fcompletions", "encoded '/'"),
    ("/v1/chat/completions%3Fx", "encoded '?'"),
    ("/v1/chat/completions%23x", "encoded '#'"),
    ("/v1/chat%5Ccompletions", "encoded '\\'"),
    ("/v1/chat\\completions", "'\\'"),
    ("/v1/chat/%00/completions", "control character"),
    ("/v1/chat/%252e/completions", "percent-encoded twice"),
    ("/v1/chat/%zz", "not a valid escape"),
    ("/v1/chat/%ff", "UTF-8"),
    ("/v1/../../x", "above the root"),
    ("/../v1/chat/completions", "above the root"),
    ("/v1/chat/%2e%2e/%2e%2e/%2e%2e/x", "above the root"),
]


class TestCanonicalPath:
    @pytest.mark.parametrize("raw", [s.partition("?")[0] for s in CHAT_SPELLINGS[2:]])
    def test_every_spelling_of_the_chat_path_is_one_path(self, raw):
        assert canonical_path(raw) == CanonicalPath("/v1/chat/completions")

    @pytest.mark.parametrize(("raw", "reason"), AMBIGUOUS)
    def test_an_ambiguous_path_is_refused_with_the_reason(self, raw, reason):
        with pytest.raises(InvalidPath) as caught:
            canonical_path(raw)
        assert reason in caught.value.message and caught.value.status == 400

    @pytest.mark.parametrize(("raw", "reason"), AMBIGUOUS[:3])
    def test_a_path_refused_once_is_refused_again_when_it_comes_again(self, raw, reason):
        for _ in range(2):
            with pytest.raises(InvalidPath, match=re.escape(reason)):
                canonical_path(raw)

    def test_the_root_is_a_slash(self):
        assert canonical_path("//./").value == "/"

    def test_other_escapes_decode_once(self):
        assert canonical_path("/v1/files/a%20b%C3%A9").value == "/v1/files/a bé"

    def test_each_counted_path_is_named_with_its_api_shape(self):
        apis = AdapterRegistry()
        assert apis.api_for("/v1/chat/completions") == apis.api_for("/chat/completions") == "chat"
        assert apis.api_for("/openai/deployments/gpt4/chat/completions") == "chat"
        assert (apis.api_for("/v1/responses"), apis.api_for("/v1/completions")) == ("responses", "completions")
        assert (apis.api_for("/v1/messages"), apis.api_for("/v1/messages/count_tokens")) == ("messages", "count_tokens")
        assert apis.api_for("/v1/models") is None


class TestAShapesOwnPaths:
    """A shape that reads its own paths (`Shape.reads_path`, Bedrock's model ids) decides their
    spelling; every other path is read by the general rules, an encoded '/' refused."""

    ARN = "arn%3Aaws%3Abedrock%3Aus-east-1%3A123456789012%3Ainference-profile%2Fus.anthropic.claude-sonnet-4-5-v1%3A0"

    def test_an_arns_encoded_slash_stays_inside_its_model_segment(self):
        path = canonical_path(f"/model/{self.ARN}/converse")
        assert path.segments == (
            "model",
            "arn:aws:bedrock:us-east-1:123456789012:inference-profile%2Fus.anthropic.claude-sonnet-4-5-v1:0",
            "converse",
        )
        assert AdapterRegistry().api_for(path.value) == "converse"

    def test_a_model_id_the_shape_refuses_is_an_invalid_path(self):
        with pytest.raises(InvalidPath, match="not a Bedrock model id"):
            canonical_path("/model/..%2F..%2Fadmin/converse")

    def test_an_encoded_slash_outside_a_shapes_own_path_is_still_refused(self):
        with pytest.raises(InvalidPath, match="encoded '/'"):
            canonical_path(f"/v1/models/{self.ARN}")


class TestPassthroughPolicy:
    def test_the_default_forwards_the_openai_api_surface_only(self):
        policy = PassthroughPolicy()
        assert policy.allows(CanonicalPath("/v1/models")) and policy.allows(CanonicalPath("/v1"))
        assert not policy.allows(CanonicalPath("/")) and not policy.allows(CanonicalPath("/v1beta/models"))

    def test_all_none_and_prefix_lists_parse_from_yaml_values(self):
        assert PassthroughPolicy.parse("all").allows(CanonicalPath("/anything"))
        assert not PassthroughPolicy.parse("none").allows(CanonicalPath("/v1/models"))
        assert PassthroughPolicy.parse(["/v1/models"]).allows(CanonicalPath("/v1/models/gpt-4o"))
        assert not PassthroughPolicy.parse(["/v1/models"]).allows(CanonicalPath("/v1/models-x"))

    @pytest.mark.parametrize("value", ["some", 5, ["v1"], ["/v1/../x"], ["/v1//models"]])
    def test_a_bad_policy_is_a_value_error(self, value):
        with pytest.raises(ValueError, match="passthrough"):
            PassthroughPolicy.parse(value)


class TestUpstreamUrl:
    def test_the_client_v1_is_replaced_by_the_upstream_base_path(self):
        url = upstream_url(
            "https://vertex.example/v1beta1/projects/p/endpoints/openapi", CanonicalPath("/v1/chat/completions")
        )
        assert str(url) == "https://vertex.example/v1beta1/projects/p/endpoints/openapi/chat/completions"

    def test_segments_are_encoded_and_the_query_kept_as_given(self):
        url = upstream_url("http://h:8000/v1", CanonicalPath("/v1/files/a b?#"), "x=%2F&y")
        assert url.raw_path == "/v1/files/a%20b%3F%23" and url.raw_query_string == "x=%2F&y"


class TestRoutingOverSockets:
    @pytest.mark.parametrize("target", CHAT_SPELLINGS)
    async def test_every_spelling_of_the_chat_path_is_counted(self, proxy, upstream, logs, target):
        response = await raw_request(proxy.port, "POST", target, HI, JSON)
        assert response.status == 200 and "x-context-guard-tokens-before" in response.headers
        assert upstream.received[-1].path == "/v1/chat/completions"
        assert [e["outcome"] for e in logs.events("request")] == ["unchanged"] and not logs.events("passthrough")

    async def test_the_query_string_reaches_the_upstream_untouched(self, proxy, upstream):
        await raw_request(proxy.port, "POST", "/v1/chat/./completions?api-version=2024-10-21&x=%2F", HI, JSON)
        assert upstream.received[-1].raw_query == "api-version=2024-10-21&x=%2F"

    @pytest.mark.parametrize(("target", "reason"), AMBIGUOUS)
    async def test_an_ambiguous_path_gets_400_and_reaches_nothing(self, proxy, upstream, target, reason):
        response = await raw_request(proxy.port, "POST", target, HI, JSON)
        assert response.status == 400 and response.json()["error"]["code"] == "invalid_path"
        assert upstream.received == []

    async def test_a_fragment_in_the_request_target_gets_400(self, proxy, upstream):
        response = await raw_request(proxy.port, "POST", "/v1/models#/../chat/completions", HI, JSON)
        assert response.status == 400 and response.json()["error"]["code"] == "invalid_path"
        assert upstream.received == []

    @pytest.mark.parametrize("target", ["/v1/chat/completions", "/v1/chat/./completions/", "/chat/completions"])
    async def test_other_methods_on_a_chat_path_get_405(self, proxy, upstream, target):
        response = await raw_request(proxy.port, "GET", target)
        assert response.status == 405 and response.headers["Allow"] == "POST"
        assert response.json()["error"]["code"] == "method_not_allowed" and upstream.received == []

    async def test_a_route_is_kept_per_path_and_method_and_only_so_many(self, proxy, upstream):
        assert (await raw_request(proxy.port, "POST", "/v1/chat/completions", HI, JSON)).status == 200
        assert (await raw_request(proxy.port, "GET", "/v1/chat/completions")).status == 405  # refused, not kept
        for i in range(ROUTES_KEPT + 20):
            assert (await raw_request(proxy.port, "GET", f"/v1/models/m{i}")).status == 200
        routes = proxy.app[GATEWAY].routes
        assert len(routes) == ROUTES_KEPT and ("/v1/chat/completions", "GET") not in routes
        assert ("/v1/chat/completions", "POST") not in routes  # the oldest went: the table never freezes
        assert (f"/v1/models/m{ROUTES_KEPT + 19}", "GET") in routes
        assert upstream.received[-1].path == f"/v1/models/m{ROUTES_KEPT + 19}"  # past the bound: routed all the same

    async def test_the_openai_api_surface_is_passed_through(self, proxy, upstream, logs):
        response = await raw_request(proxy.port, "GET", "/v1//models/./gpt-4o/")
        assert response.status == 200 and upstream.received[-1].path == "/v1/models/gpt-4o"
        (event,) = logs.events("request")
        assert event["kind"] == "passthrough" and event["path"] == "/v1/models/gpt-4o"

    @pytest.mark.parametrize("target", ["/", "/health", "/v2/models", "/favicon.ico", "/v1beta/models"])
    async def test_paths_outside_the_api_are_answered_here_with_404(self, start_proxy, upstream, target, monkeypatch):
        """In the shape the path's clients read: Google's on Google's own paths (no upstream of Google's here)."""
        monkeypatch.setenv("FAKE_KEY", "sk-operator-secret")
        settings = gateway_settings(
            upstream.url, upstreams={"fake": {"base_url": upstream.url, "api_key_env": "FAKE_KEY"}}
        )
        proxy = await start_proxy(settings)
        response = await raw_request(proxy.port, "GET", target)
        error = response.json()["error"]
        assert response.status == 404
        assert error["code"] == (404 if target.startswith("/v1beta") else "unknown_url")
        assert upstream.received == []

    @pytest.mark.parametrize(
        ("base", "target", "lands_on"),
        [
            ("", "/v1/v1/chat/completions", "/v1/chat/completions"),
            ("", "/v1/openai/deployments/d1/chat/completions", "/openai/deployments/d1/chat/completions"),
            ("", "/v1/openai/v1/responses", "/openai/v1/responses"),
            ("/openai", "/v1/deployments/d1/completions", "/openai/deployments/d1/completions"),
        ],
    )
    async def test_no_spelling_reaches_a_counted_path_through_pass_through(
        self, start_proxy, upstream, logs, base, target, lands_on
    ):
        """A base URL short of its API's root (Azure's at the host) must not let a longer
        spelling land on a counted endpoint uncounted."""
        root = upstream.url.removesuffix("/v1") + base
        proxy = await start_proxy(gateway_settings(root, upstreams={"fake": {"base_url": root}}))
        response = await raw_request(proxy.port, "POST", target, HI, JSON)
        assert response.status == 404 and lands_on in response.json()["error"]["message"]
        assert upstream.received == []
        assert (await raw_request(proxy.port, "POST", lands_on, HI, JSON)).status == 200  # counted as itself
        assert logs.events("request")[-1]["kind"] != "passthrough"

    async def test_a_longer_spelling_that_lands_on_a_generating_path_elsewhere_is_refused(self, proxy, upstream):
        """With the base at `/v1`, `/v1/v1/chat/completions` would reach `/v1/v1/chat/completions`: a
        chat endpoint the guard does not count (a base URL can make another API reachable), so it
        goes nowhere; the same longer spelling of a listing is forwarded."""
        response = await raw_request(proxy.port, "POST", "/v1/v1/chat/completions", HI, JSON)
        assert response.status == 404 and upstream.received == []
        assert (await raw_request(proxy.port, "GET", "/v1/v1/models")).status == 200
        assert upstream.received[-1].path == "/v1/v1/models"

    async def test_local_endpoints_are_answered_here(self, proxy, upstream):
        assert (await raw_request(proxy.port, "GET", "/healthz/")).json()["status"] == "ok"
        assert (await raw_request(proxy.port, "POST", "/healthz")).status == 405
        assert upstream.received == []

    async def test_a_none_policy_forwards_nothing_but_chat(self, aiohttp_server, model_map, upstream):
        settings = gateway_settings(upstream.url)
        settings = dataclasses.replace(settings, server=dataclasses.replace(settings.server, passthrough="none"))
        app = create_app(settings, Models(settings, model_map))
        proxy = await aiohttp_server(app)
        assert (await raw_request(proxy.port, "GET", "/v1/models")).status == 404
        assert (await raw_request(proxy.port, "POST", "/v1/chat/completions", HI, JSON)).status == 200
        assert [r.path for r in upstream.received] == ["/v1/chat/completions"]

    async def test_with_an_all_policy_every_url_stays_under_the_base_path(self, aiohttp_server, model_map, upstream):
        base = upstream.url + "/deployments/d1"
        settings = gateway_settings(base)
        settings = dataclasses.replace(settings, server=dataclasses.replace(settings.server, passthrough="all"))
        app = create_app(settings, Models(settings, model_map))
        proxy = await aiohttp_server(app)
        for target in ["/other", "/v1/models/../../x", "/a/./b/../c/"]:
            assert (await raw_request(proxy.port, "GET", target)).status == 200
        assert [r.path for r in upstream.received] == [
            "/v1/deployments/d1/other",
            "/v1/deployments/d1/x",
            "/v1/deployments/d1/a/c",
        ]
        assert (await raw_request(proxy.port, "GET", "/v1/../../x")).status == 400


class TestASecondListener:
    """A server the proxy must never reach, whatever the client writes."""

    @pytest.fixture
    async def sentinel(self, aiohttp_server) -> tuple[FakeUpstream, int]:
        fake = FakeUpstream()
        server = await aiohttp_server(fake.app())
        return fake, server.port

    async def test_no_request_target_or_header_reaches_it(self, aiohttp_server, model_map, upstream, sentinel):
        fake, port = sentinel
        settings = gateway_settings(upstream.url)
        settings = dataclasses.replace(settings, server=dataclasses.replace(settings.server, passthrough="all"))
        app = create_app(settings, Models(settings, model_map))
        proxy = await aiohttp_server(app)
        attempts = [
            ("GET", f"http://127.0.0.1:{port}/v1/models", {}),
            ("GET", "/v1/models", {"Host": f"127.0.0.1:{port}", "X-Forwarded-Host": f"127.0.0.1:{port}"}),
            ("GET", f"//127.0.0.1:{port}/v1/models", {}),
            ("GET", f"/v1/@127.0.0.1:{port}/models", {}),
            ("GET", f"/v1/..%2F..%2F127.0.0.1:{port}", {}),
            ("POST", f"http://127.0.0.1:{port}/v1/chat/completions", JSON),
        ]
        for method, target, headers in attempts:
            await raw_request(proxy.port, method, target, HI if method == "POST" else b"", headers)
        assert fake.received == []
