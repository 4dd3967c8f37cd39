"""Google's own paths read once: which generate uncounted, which pass to a Google upstream, and
which are answered in Google's error shape."""

from __future__ import annotations

import pytest

from proxy.apis.gemini.google_paths import GooglePath, generation_method, google_path, is_google_shaped, passes


def segments(path: str) -> tuple[str, ...]:
    return tuple(s for s in path.split("/") if s)


class TestReading:
    def test_a_vertex_path_names_its_project_and_location(self) -> None:
        path = google_path(segments("/v1beta1/projects/p/locations/us-central1/cachedContents/c1"))
        assert path == GooglePath("v1beta1", "p", "us-central1", ("cachedContents", "c1"))

    def test_an_upload_path_is_read_under_its_version(self) -> None:
        path = google_path(segments("/upload/v1beta/files"))
        assert path is not None and path.upload and path.resource == ("files",)

    def test_a_path_without_one_of_google_s_versions_is_none(self) -> None:
        assert google_path(segments("/openai/deployments/d/chat/completions")) is None

    @pytest.mark.parametrize(
        "path",
        ["/v1beta/models/m:batchGenerateContent", "/v1/models/m:GENERATECONTENT", "/v1/x/y:predictLongRunning",
         "/v1/projects/p/locations/l/publishers/google/models/m:rawPredict", "/v1/models/m:generate_content ",
         "/v1/projects/p/locations/l/endpoints/123:streamGenerateContent"],
    )  # fmt: skip
    def test_a_generating_method_is_found_in_any_case(self, path: str) -> None:
        assert generation_method(segments(path)) is not None

    def test_a_method_that_does_not_generate_is_not_one(self) -> None:
        assert generation_method(segments("/v1beta/models/m:embedContent")) is None
        assert generation_method(segments("/v1beta/cachedContents/c")) is None


class TestTheAllowList:
    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("POST", "/v1/cachedContents"), ("GET", "/v1beta/cachedContents/c"), ("PATCH", "/v1beta/cachedContents/c"),
            ("DELETE", "/v1beta1/projects/p/locations/l/cachedContents/c"), ("GET", "/v1beta/files"),
            ("POST", "/upload/v1beta/files"), ("GET", "/v1beta/models"), ("GET", "/v1/models/gemini-2.5-flash"),
            ("GET", "/v1beta1/publishers/google/models"), ("GET", "/v1beta/interactions/int_1"),
            ("POST", "/v1beta/interactions/int_1/cancel"),
        ],
    )  # fmt: skip
    def test_caches_files_listings_and_stored_interactions_pass(self, method: str, path: str) -> None:
        found = google_path(segments(path))
        assert found is not None and passes(found, method)

    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("POST", "/v1beta/models/m"), ("GET", "/v1beta/tunedModels"), ("POST", "/v1beta/batches"),
            ("GET", "/v1beta/cachedContents/c:extend"), ("GET", "/v1/v1beta/models"), ("POST", "/v1beta/interactions/i"),
            ("POST", "/v1/projects/p/locations/l/endpoints/openapi/chat/completions"), ("GET", "/v1beta/operations/o"),
            ("POST", "/upload/v1beta/models/m"),
        ],
    )  # fmt: skip
    def test_anything_else_does_not(self, method: str, path: str) -> None:
        found = google_path(segments(path))
        assert found is None or not passes(found, method)


class TestErrorShape:
    @pytest.mark.parametrize("path", ["/v1beta/nothing", "/v1/cachedContents/x", "/v1/models/m:predict"])
    def test_google_s_own_paths_are_answered_in_its_shape(self, path: str) -> None:
        assert is_google_shaped(segments(path))

    @pytest.mark.parametrize("path", ["/v1/models", "/v1/files", "/v2/models", "/health"])
    def test_paths_openai_has_too_are_not(self, path: str) -> None:
        assert not is_google_shaped(segments(path))
