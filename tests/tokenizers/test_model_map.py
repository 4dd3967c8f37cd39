"""The model map: the fields the registry reads, from litellm's bundled file or the operator's, held small."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from proxy.errors import ConfigError
from proxy.tokenizers.model_map import FIELDS, bundled_model_map_path, load_model_map


def write(folder: Path, data: object) -> Path:
    path = folder / "map.json"
    path.write_text(json.dumps(data))
    return path


class TestLoadModelMap:
    def test_each_entry_keeps_only_the_fields_the_registry_reads(self, tmp_path):
        entry = {"mode": "chat", "max_input_tokens": 128000, "max_tokens": 16384, "input_cost_per_token": 2.5e-06}
        loaded = load_model_map(write(tmp_path, {"gpt-4o": entry}))
        assert loaded == {"gpt-4o": {"mode": "chat", "max_input_tokens": 128000, "max_tokens": 16384}}

    def test_entries_with_equal_fields_share_one_mapping(self, tmp_path):
        same = {"mode": "chat", "max_input_tokens": 8192}
        loaded = load_model_map(
            write(tmp_path, {"a": same, "b": {**same, "litellm_provider": "x"}, "c": {"mode": "chat"}})
        )
        assert loaded["a"] is loaded["b"] and loaded["a"] is not loaded["c"]

    def test_equal_values_of_different_types_are_not_shared(self, tmp_path):
        loaded = load_model_map(
            write(tmp_path, {"a": {"max_tokens": 1}, "b": {"max_tokens": 1.0}, "c": {"max_tokens": True}})
        )
        assert [type(loaded[k]["max_tokens"]) for k in "abc"] == [int, float, bool]

    def test_an_entry_with_a_list_value_is_kept_unshared(self, tmp_path):
        loaded = load_model_map(write(tmp_path, {"a": {"mode": ["chat"]}, "b": {"mode": ["chat"]}}))
        assert loaded["a"] == loaded["b"] == {"mode": ["chat"]}

    def test_an_entry_s_own_objects_and_lists_are_dropped_and_it_is_still_shared(self, tmp_path):
        nested = {"mode": "chat", "tiered_pricing": {"mode": "x", "rate": 1}, "regions": [{"mode": "y"}]}
        loaded = load_model_map(write(tmp_path, {"a": nested, "b": {"mode": "chat"}, "c": {"pricing": {"a": 1}}}))
        assert loaded == {"a": {"mode": "chat"}, "b": {"mode": "chat"}, "c": {}}
        assert loaded["a"] is loaded["b"]

    def test_the_sample_entry_and_entries_that_are_not_objects_are_dropped(self, tmp_path):
        loaded = load_model_map(write(tmp_path, {"sample_spec": {"mode": "chat"}, "odd": 3, "m": {"mode": "chat"}}))
        assert list(loaded) == ["m"]

    def test_a_file_that_is_not_json_names_the_file(self, tmp_path):
        path = tmp_path / "map.json"
        path.write_text("{not json")
        with pytest.raises(ConfigError, match=r"map\.json cannot be read"):
            load_model_map(path)

    def test_a_file_that_is_not_a_json_object_is_refused(self, tmp_path):
        with pytest.raises(ConfigError, match="is not a JSON object"):
            load_model_map(write(tmp_path, ["gpt-4o"]))

    def test_litellm_s_bundled_map_loads_with_every_entry_reduced_to_the_fields_read(self):
        if bundled_model_map_path() is None:
            pytest.skip("litellm's bundled model map is not installed")
        loaded = load_model_map()
        assert len(loaded) > 1000 and loaded["gpt-4o"]["max_input_tokens"] >= 128000
        assert all(set(entry) <= set(FIELDS) for entry in loaded.values())
