"""What each upstream kind's provider says (proxy.providers): the shapes it serves, where an
operator's key goes, how it behaves as a backend, the windows a header opts into, the held
context it can size, and the last word on an outgoing call."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, ClassVar

import pytest

from proxy.config.settings import settings_from_dict
from proxy.config.upstreams import UpstreamSettings
from proxy.core.models.opt_in_windows import opted_in
from proxy.errors import ConfigError
from proxy.providers import kinds
from proxy.providers.kinds import KINDS, PROVIDERS, provider_for
from proxy.providers.local import Generic
from proxy.providers.provider import OutgoingCall, Provider, SettingsRefused

BETA = {"anthropic-beta": "context-1m-2025-08-07"}


class TestRegistry:
    def test_every_kind_has_one_provider_under_its_own_name(self) -> None:
        assert all(provider.kind == kind for kind, provider in PROVIDERS.items())
        assert set(KINDS) == {
            "auto", "openai", "azure", "vertex", "gemini", "vllm", "llamacpp", "ollama", "anthropic", "generic", "echo",
            "bedrock",
        }  # fmt: skip

    def test_an_unknown_kind_is_an_error_listing_the_known_ones(self) -> None:
        with pytest.raises(ValueError, match=r"must be one of auto, openai, .*echo, not 'tgi'"):
            provider_for("tgi")

    def test_an_upstream_s_provider_is_resolved_once_with_its_settings(self) -> None:
        upstream = UpstreamSettings(base_url="https://api.anthropic.com/v1", kind="anthropic")
        assert upstream.provider is upstream.provider and upstream.provider.kind == "anthropic"


class TestShapes:
    @pytest.mark.parametrize(
        ("kind", "shapes"),
        [
            ("openai", ("chat", "responses", "completions")),
            ("azure", ("chat", "responses", "completions")),
            ("anthropic", ("messages",)),
            ("vertex", ("chat", "generate_content", "interactions")),
            ("gemini", ("generate_content", "interactions")),
            ("llamacpp", ("chat", "completions")),
            ("auto", ("chat", "responses", "completions", "messages")),
        ],
    )
    def test_a_kind_serves_its_own_shapes_unless_the_config_lists_them(self, kind: str, shapes: tuple[str, ...]) -> None:
        assert provider_for(kind).shapes == shapes


class TestCredentials:
    @pytest.mark.parametrize(
        ("kind", "header"),
        [("anthropic", "x-api-key"), ("azure", "api-key"), ("gemini", "x-goog-api-key"), ("vertex", "x-goog-api-key")],
    )
    def test_a_hosted_api_takes_an_operator_s_key_in_a_header_of_its_own(self, kind: str, header: str) -> None:
        assert provider_for(kind).key_header == header

    @pytest.mark.parametrize("kind", ["openai", "vllm", "generic", "echo"])
    def test_other_kinds_take_it_as_a_bearer_token(self, kind: str) -> None:
        assert provider_for(kind).key_header is None

    def test_only_google_s_apis_keep_the_operator_s_credential_in_a_project(self) -> None:
        assert {kind for kind, p in PROVIDERS.items() if p.google_native} == {"gemini", "vertex"}


class TestBackends:
    @pytest.mark.parametrize(
        ("kind", "backend"), [("azure", "openai"), ("anthropic", "openai"), ("echo", "openai"), ("gemini", "vertex")]
    )
    def test_a_hosted_api_behaves_as_the_backend_it_words_its_limits_like(self, kind: str, backend: str) -> None:
        assert provider_for(kind).backend_kind == backend

    def test_only_self_hosted_servers_are_asked_what_they_are_at_start(self) -> None:
        assert {kind for kind, p in PROVIDERS.items() if p.discovered} == {"auto", "vllm", "llamacpp", "ollama"}

    def test_a_correction_names_anthropic_though_it_is_counted_as_an_openai_like_backend(self) -> None:
        assert provider_for("anthropic").corrections_name == "anthropic"
        assert provider_for("openai").corrections_name is None  # the backend discovery found names it

    def test_a_server_nothing_is_known_of_is_named_in_no_correction(self) -> None:
        """As the error's own words say, then."""
        assert {kind for kind, p in PROVIDERS.items() if p.backend and not p.backend.named_in_corrections} == {
            "generic"
        }


class TestOptIns:
    @pytest.mark.parametrize("kind", ["openai", "vllm", "gemini", "vertex", "generic"])
    def test_anthropic_s_beta_header_opens_nothing_on_another_provider(self, kind: str) -> None:
        assert opted_in("claude-sonnet-4-5", BETA, provider_for(kind).opt_ins, "messages") is None

    def test_on_anthropic_s_messages_api_it_opens_a_million_tokens(self) -> None:
        opt_in = opted_in("claude-sonnet-4-5", BETA, provider_for("anthropic").opt_ins, "messages")
        assert opt_in is not None and opt_in.context_window == 1_000_000


class TestHeldContext:
    def test_openai_counts_a_stored_response_or_conversation_with_the_request(self) -> None:
        assert provider_for("openai").counts_held_with_request == {"response", "conversation"}
        assert not provider_for("azure").counts_held_with_request

    @pytest.mark.parametrize(
        ("kind", "base", "path"),
        [
            ("gemini", "https://generativelanguage.googleapis.com", ("v1beta", "cachedContents", "c1")),
            ("vertex", "https://aiplatform.googleapis.com", ("v1", "cachedContents", "c1")),
            ("vertex", "https://aiplatform.googleapis.com/v1beta1/projects/p", ("v1beta1", "cachedContents", "c1")),
        ],
    )
    def test_google_says_a_cache_s_size_at_its_version_s_cached_contents(
        self, kind: str, base: str, path: tuple[str, ...]
    ) -> None:
        assert provider_for(kind).held_size_path(base, "cache", "cachedContents/c1") == path

    def test_a_name_that_is_not_a_cache_s_is_never_asked_about(self) -> None:
        gemini = provider_for("gemini")
        assert gemini.held_size_path("https://g", "cache", "cachedContents/../x") is None
        assert gemini.held_size_path("https://g", "interaction", "cachedContents/c1") is None
        assert provider_for("openai").held_size_path("https://o/v1", "cache", "cachedContents/c1") is None


class TestGooglePaths:
    def test_a_gemini_upstream_takes_every_forwarded_path_at_its_native_api(self) -> None:
        assert provider_for("gemini").native_path(asks_google=False)

    def test_vertex_takes_only_google_s_own_paths_there(self) -> None:
        vertex = provider_for("vertex")
        assert vertex.native_path(asks_google=True) and not vertex.native_path(asks_google=False)

    def test_a_path_naming_a_project_prefers_vertex_and_any_other_the_gemini_api(self) -> None:
        vertex, gemini = provider_for("vertex"), provider_for("gemini")
        assert vertex.google_preference(True) < gemini.google_preference(True)  # type: ignore[operator]
        assert gemini.google_preference(False) < vertex.google_preference(False)  # type: ignore[operator]
        assert provider_for("openai").google_preference(True) is None


class TestFinish:
    def test_a_provider_that_does_not_sign_sends_an_outgoing_call_as_built(self) -> None:
        call = OutgoingCall("POST", "https://h/v1/chat/completions", {"Authorization": "Bearer k"}, b"{}")
        assert Provider().finish(call, None) is call
        assert {provider.kind for provider in PROVIDERS.values() if provider.signs} == {"bedrock"}
        assert all(provider.finish(call, None) is call for provider in PROVIDERS.values() if not provider.signs)


class TestPurity:
    def test_importing_the_providers_loads_no_server_network_or_settings_code(self) -> None:
        """They describe calls; the server makes them (as the adapters, they sit below the settings)."""
        code = (
            "import sys, proxy.providers.kinds;"
            "print(','.join(m for m in ('aiohttp', 'yaml', 'proxy.server', 'proxy.config') if m in sys.modules))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == ""


class TestSettingsChecks:
    """A provider refuses the settings its kind cannot work with, and the settings error names the key."""

    class Regional(Generic):
        kind: ClassVar[str] = "regional"

        def check(self, upstream: Any) -> None:
            if not upstream.headers.get("x-region"):
                raise SettingsRefused("a regional upstream needs the region it serves in x-region", "headers")

    def test_settings_a_provider_refuses_are_a_config_error_naming_the_key(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(kinds.PROVIDERS, "regional", self.Regional())
        data = {"upstreams": {"r": {"base_url": "https://r.example/v1", "kind": "regional"}}}
        with pytest.raises(ConfigError, match=r"upstreams\.r\.headers: a regional upstream needs the region"):
            settings_from_dict(data, "test.yaml", {})
        data["upstreams"]["r"]["headers"] = {"x-region": "eu"}
        assert settings_from_dict(data, "test.yaml", {}).upstreams["r"].provider.kind == "regional"
