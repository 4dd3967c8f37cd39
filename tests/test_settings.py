"""Settings: one frozen object from YAML; every mistake names the file, the key and the reason."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from proxy.config.schema import plain
from proxy.config.settings import Settings, load_settings, settings_from_dict
from proxy.config.upstreams import UpstreamSettings
from proxy.errors import ConfigError

DOCUMENTED = Path(__file__).parent.parent / "config" / "context-guard.yaml"


def load(data: dict, env: dict | None = None) -> Settings:
    return settings_from_dict(data, "cg.yaml", env or {})


class TestDocumentedConfig:
    def test_loads_to_exactly_the_built_in_defaults(self):
        documented = load_settings(DOCUMENTED, env={})
        assert documented == Settings() and plain(documented) == plain(Settings())

    @pytest.mark.parametrize(
        "path", sorted((Path(__file__).parent.parent / "examples").glob("*.yaml")), ids=lambda p: p.name
    )
    def test_every_example_config_loads(self, path):
        env = {"OPENAI_API_KEY": "x", "VERTEX_PROJECT": "p", "VERTEX_LOCATION": "us-central1", "CONTEXT_GUARD_KEY": "k"}
        assert settings_from_dict(__import__("yaml").safe_load(path.read_text()), str(path), env).upstreams

    def test_an_empty_file_is_the_defaults(self, tmp_path):
        (tmp_path / "empty.yaml").write_text("")
        assert load_settings(tmp_path / "empty.yaml", env={}).server.port == 8080


class TestErrorsNameFileAndKey:
    @pytest.mark.parametrize(
        ("data", "key", "fragment"),
        [
            ({"server": {"port": "eighty"}}, "server.port", "must be a whole number, not 'eighty'"),
            ({"server": {"port": 70000}}, "server.port", "must be at most 65535"),
            ({"server": {"prot": 1}}, "server.prot", "unknown setting; known here: allow_mode_header"),
            ({"trim": {"mode": "aggressive"}}, "trim.mode", "must be one of enforce, dry_run, off"),
            (
                {"trim": {"pipeline": ["drop_everything"]}},
                "trim.pipeline",
                "unknown strategy 'drop_everything'; known:",
            ),
            ({"trim": {"options": {"nope": {}}}}, "trim.options.nope", "unknown strategy"),
            (
                {"trim": {"options": {"drop_oldest_turns": {"bogus": 1}}}},
                "trim.options.drop_oldest_turns.bogus",
                "unknown option; known: head_share, keep_partial, low_water, min_history_tokens, min_history_turns, min_partial_tokens",
            ),
            ({"trim": {"options": {"shrink_messages": {"cap": "big"}}}}, "trim.options.shrink_messages.cap", "must be a whole number"),
            ({"trim": {"options": {"shrink_messages": {"roles": "assistant"}}}}, "trim.options.shrink_messages.roles", "must be a list"),
            ({"trim": {"options": {"shrink_messages": {"caps": {"tool": "x"}}}}}, "trim.options.shrink_messages.caps.tool", "must be a whole number, not 'x'"),
            ({"trim": {"options": {"drop_oldest_turns": {"min_history_turns": -5}}}}, "trim.options.drop_oldest_turns.min_history_turns", "at least 0"),
            ({"server": {"client_keys": [""]}}, "server.client_keys", "a client key is empty"),
            ({"budget": {"output_reserve_min": 10, "output_reserve_max": 5}}, "budget", "reserve_min <= output_reserve_max"),
            ({"upstreams": {"x": {"base_url": "ftp://nope"}}}, "upstreams.x.base_url", "must start with http"),
            (
                {"routes": [{"match": "*", "upstream": "missing"}]},
                "routes[0].upstream",
                "not one of the upstreams: openai",
            ),
            (
                {"models": {"overrides": [{"match": "m", "tokenizer": "sentencepiece:x"}]}},
                "models.overrides[0].tokenizer",
                "unknown tokenizer kind",
            ),
            ({"models": {"overrides": [{"match": "m", "context_window": 100}]}}, "models.overrides[0].context_window", "at least 256"),
            ({"models": {"overrides": [{"context_window": 1000}]}}, "models.overrides[0].match", "is required"),
            ({"upstreams": {"x": {"base_url": "${MISSING_URL}"}}}, "upstreams.x.base_url", "MISSING_URL is not set"),
            ({"bogus_section": {}}, "bogus_section", "unknown setting"),
            ({"tokenizers": {"cache_bytes": -1}}, "tokenizers.cache_bytes", "must be at least 0"),
        ],
    )
    def test_rejects(self, data, key, fragment):
        with pytest.raises(ConfigError) as caught:
            load(data)
        assert str(caught.value).startswith(f"cg.yaml: {key}: ") and fragment in str(caught.value)

    def test_unreadable_and_invalid_files(self, tmp_path):
        with pytest.raises(ConfigError, match="cannot read"):
            load_settings(tmp_path / "missing.yaml")
        (tmp_path / "bad.yaml").write_text("server: [unclosed")
        with pytest.raises(ConfigError, match=r"bad\.yaml: not valid YAML"):
            load_settings(tmp_path / "bad.yaml")


class TestValues:
    def test_environment_references_are_expanded_with_defaults(self):
        settings = load(
            {
                "upstreams": {
                    "v": {"base_url": "https://${REGION:-us-central1}-aiplatform.googleapis.com/v1/${PROJECT}"}
                }
            },
            {"PROJECT": "p1"},
        )
        assert settings.upstreams["v"].base_url == "https://us-central1-aiplatform.googleapis.com/v1/p1"

    def test_a_whole_value_reference_keeps_its_number_or_boolean_type(self):
        settings = load({"server": {"port": "${PORT:-9000}", "allow_mode_header": "${DEBUG}"}}, {"DEBUG": "true"})
        assert settings.server.port == 9000 and settings.server.allow_mode_header is True

    def test_a_reference_inside_a_string_stays_text(self):
        settings = load({"upstreams": {"v": {"base_url": "http://h:${P}/v1"}}}, {"P": "8000"})
        assert settings.upstreams["v"].base_url == "http://h:8000/v1"

    def test_settings_are_frozen(self):
        with pytest.raises(dataclasses.FrozenInstanceError):
            Settings().server.port = 1  # type: ignore[misc]

    def test_the_upstream_flag_sends_everything_to_one_url(self):
        settings = Settings().with_upstream_url("http://localhost:8000/v1/")
        assert [u.base_url for u in settings.upstreams.values()] == ["http://localhost:8000/v1"]
        assert settings.routes[0].match == "*"


class TestSafeWhenExposed:
    def test_listening_beyond_loopback_and_injecting_a_key_without_client_keys_is_refused(self):
        settings = load({"server": {"host": "0.0.0.0"}})
        problem = settings.exposure_problem({"OPENAI_API_KEY": "sk-operator"})
        assert problem is not None and "0.0.0.0" in problem and "allow_unauthenticated" in problem

    def test_client_keys_loopback_or_no_injected_credential_may_start(self):
        env = {"OPENAI_API_KEY": "sk-operator"}
        assert load({"server": {"host": "0.0.0.0", "client_keys": ["k"]}}).exposure_problem(env) is None
        assert load({}).exposure_problem(env) is None
        assert load({"server": {"host": "0.0.0.0"}}).exposure_problem({}) is None

    def test_the_operator_may_opt_out_and_is_then_warned(self):
        settings = load({"server": {"host": "0.0.0.0", "allow_unauthenticated": True}})
        env = {"OPENAI_API_KEY": "sk-operator"}
        assert settings.exposure_problem(env) is None and settings.unauthenticated_warning(env)

    def test_the_docker_image_config_needs_a_client_key(self):
        docker = Path(__file__).parent.parent / "config" / "docker.yaml"
        with pytest.raises(ConfigError, match="client_keys\\[0\\]: environment variable CONTEXT_GUARD_KEY is not set"):
            load_settings(docker, env={})
        settings = load_settings(docker, env={"CONTEXT_GUARD_KEY": "cg"})
        assert settings.with_server(host="0.0.0.0").exposure_problem({"OPENAI_API_KEY": "sk"}) is None


class TestSummariserSettings:
    def test_the_summariser_must_name_a_configured_upstream_that_serves_chat(self):
        with pytest.raises(ConfigError, match=r"trim\.summariser\.upstream: 'nope' is not one of the upstreams"):
            load({"trim": {"summarize_dropped": True, "summariser": {"upstream": "nope", "model": "m"}}})

    def test_sending_everything_elsewhere_with_the_upstream_flag_is_checked_again(self):
        settings = load({"trim": {"summarize_dropped": True, "summariser": {"upstream": "openai", "model": "m"}}})
        with pytest.raises(ValueError, match="'openai' is not one of the upstreams: cli"):
            settings.with_upstream_url("http://127.0.0.1:8000/v1")


class TestServedApis:
    """`upstreams.<name>.apis`: the API shapes an upstream serves (its kind's, unless listed)."""

    @staticmethod
    def upstream(**fields: object) -> UpstreamSettings:
        settings = settings_from_dict({"upstreams": {"x": {"base_url": "http://a", **fields}}}, "c.yaml", {})
        return settings.upstreams["x"]

    def test_a_generic_upstream_serves_every_shape_unless_it_lists_some(self):
        generic = self.upstream(kind="generic")
        assert all(generic.serves(api) for api in ("chat", "responses", "completions", "messages"))
        listed = self.upstream(kind="generic", apis=["chat"])
        assert listed.serves("chat") and not listed.serves("messages")

    def test_an_unknown_shape_is_a_config_error_naming_it(self):
        with pytest.raises(ConfigError, match=r"upstreams\.x\.apis.*graphql"):
            self.upstream(apis=["chat", "graphql"])
