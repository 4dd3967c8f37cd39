"""The operator's Google credential kept to its project, and nothing of the client's beside it."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.config.upstreams import UpstreamSettings
from proxy.server.edge.credentials import injects_credential, outside_project
from proxy.server.upstream.connection import request_headers

BASE = "https://us-central1-aiplatform.googleapis.com/v1/projects/mine/locations/us-central1/endpoints/openapi"


def vertex(base: str = BASE, **auth: str) -> UpstreamSettings:
    return UpstreamSettings(name="vertex", base_url=base, kind="vertex", **auth)  # type: ignore[arg-type]


def segments(path: str) -> tuple[str, ...]:
    return tuple(s for s in path.split("/") if s)


class TestOutsideProject:
    @pytest.mark.parametrize("auth", [{"token_command": "t"}, {"auth": "adc"}, {"api_key_env": "K"}, {"token_file": "f"}])
    def test_another_project_or_location_is_refused_with_any_credential_of_the_operator(self, auth) -> None:
        upstream = vertex(**auth)
        assert outside_project(upstream, segments("/v1/projects/theirs/locations/us-central1/x")) is not None
        assert outside_project(upstream, segments("/v1/projects/mine/locations/europe-west4/x")) is not None
        assert outside_project(upstream, segments("/v1/projects/mine/locations/us-central1/x")) is None

    def test_a_base_naming_no_project_refuses_every_path_that_names_one(self) -> None:
        upstream = vertex("https://aiplatform.googleapis.com", token_command="t")
        assert "base_url" in (outside_project(upstream, segments("/v1/projects/any/locations/l/x")) or "")
        assert outside_project(upstream, segments("/v1/publishers/google/models/m:generateContent")) is None

    def test_with_no_project_in_the_base_url_the_credential_s_own_project_is_the_one(self) -> None:
        upstream = vertex("https://aiplatform.googleapis.com", auth="adc")
        assert outside_project(upstream, segments("/v1/projects/adcs/locations/l/x"), own="adcs") is None
        assert outside_project(upstream, segments("/v1/projects/other/locations/l/x"), own="adcs") is not None

    def test_with_the_client_s_own_credential_the_project_is_the_client_s_business(self) -> None:
        assert outside_project(vertex(), segments("/v1/projects/theirs/locations/l/x")) is None

    def test_adc_is_a_credential_the_guard_injects(self) -> None:
        assert injects_credential(vertex(auth="adc"))


class TestHeadersBesideTheOperatorsCredential:
    CLIENT = CIMultiDictProxy(
        CIMultiDict({"x-goog-user-project": "theirs", "x-goog-api-key": "k", "x-api-key": "k2", "x-goog-api-client": "sdk"})
    )

    def test_the_client_s_keys_and_billing_project_are_dropped(self) -> None:
        headers = request_headers(self.CLIENT, vertex(token_command="t"), "Bearer operator")
        assert headers["Authorization"] == "Bearer operator" and headers["x-goog-api-client"] == "sdk"
        assert not {"x-goog-user-project", "x-goog-api-key", "x-api-key"} & {k.lower() for k in headers}

    def test_with_the_client_s_own_credential_they_go_as_sent(self) -> None:
        headers = request_headers(self.CLIENT, vertex(), None)
        assert headers["x-goog-user-project"] == "theirs" and headers["x-goog-api-key"] == "k"
