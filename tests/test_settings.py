"""Settings: one frozen object from YAML; every mistake names the file, the key and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.errors import ConfigError
from proxy.settings import Settings, load_settings, settings_from_dict

DOCUMENTED = Path(__file__).parent.parent / "config" / "context-guard.yaml"


def load(data: dict, env: dict | None = None) -> Settings:
    return settings_from_dict(data, "cg.yaml", env or {})


class TestDocumentedConfig:
    def test_loads_to_exactly_the_built_in_defaults(self):
        loaded, defaults = load_settings(DOCUMENTED), Settings()
        for name in Settings.__dataclass_fields__:
            if name in ("source", "trim"):
                continue
            assert getattr(loaded, name) == getattr(defaults, name), name
        assert loaded.trim.budget == defaults.trim.budget and loaded.trim.overflow == defaults.trim.overflow
        assert [s.name for s in loaded.trim.pipeline] == [s.name for s in defaults.trim.pipeline]

    @pytest.mark.parametrize(
        "path", sorted((Path(__file__).parent.parent / "examples").glob("*.yaml")), ids=lambda p: p.name
    )
    def test_every_example_config_loads(self, path):
        env = {"OPENAI_API_KEY": "x", "VERTEX_PROJECT": "p", "VERTEX_LOCATION": "us-central1", "CONTEXT_GUARD_KEY": "k"}
        assert settings_from_dict(__import__("yaml").safe_load(path.read_text()), str(path), env).upstreams

    def test_an_empty_file_is_the_defaults(self, tmp_path):
        (tmp_path / "empty.yaml").write_text("")
        assert load_settings(tmp_path / "empty.yaml").port == 8080


class TestErrorsNameFileAndKey:
    @pytest.mark.parametrize(
        ("data", "key", "fragment"),
        [
            ({"server": {"port": "eighty"}}, "server.port", "must be a whole number"),
            ({"server": {"port": 70000}}, "server.port", "between 0 and 65535"),
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
                "trim.pipeline",
                "strategy 'drop_oldest_turns'",
            ),
            ({"budget": {"output_reserve_min": 10, "output_reserve_max": 5}}, "budget", "reserve_min <= reserve_max"),
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
            ({"models": {"overrides": [{"context_window": 100}]}}, "models.overrides[0].context_window", "between 256"),
            ({"upstreams": {"x": {"base_url": "${MISSING_URL}"}}}, "upstreams.x.base_url", "MISSING_URL is not set"),
            ({"bogus_section": {}}, "bogus_section", "unknown setting"),
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

    def test_settings_are_frozen(self):
        with pytest.raises(AttributeError):
            Settings().port = 1  # type: ignore[misc]

    def test_the_upstream_flag_sends_everything_to_one_url(self):
        settings = Settings().with_upstream_url("http://localhost:8000/v1/")
        assert [u.base_url for u in settings.upstreams.values()] == ["http://localhost:8000/v1"]
        assert settings.routes[0].match == "*"
