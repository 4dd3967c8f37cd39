"""Counts are never shared by mistake: the count cache keys on the whole tokenizer, not its file name."""

from __future__ import annotations

import shutil
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers

from proxy.config.settings import settings_from_dict
from proxy.server.backends.models import Models
from proxy.tokenizers.vocabularies import bundled_encodings_dir
from tests.support.guard import plan_with

TEXT = "The quick brown fox jumps over the lazy dog, again and again. " * 40


def word_level_tokenizer(path: Path) -> None:
    """A real tokenizer.json whose vocabulary knows no word: one token per whitespace word."""
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(path))


def guard_for(tmp_path: Path, model_map: dict, *models_and_files: tuple[str, Path]) -> Models:
    overrides = [
        {"match": model, "context_window": 100_000, "tokenizer": f"huggingface:{file}"}
        for model, file in models_and_files
    ]
    return Models(settings_from_dict({"models": {"overrides": overrides}}, "test.yaml", {}), model_map)


class TestTokenizerIdentity:
    def test_two_files_with_the_same_name_never_share_counts(self, tmp_path, model_map):
        bundled = bundled_encodings_dir()
        assert bundled is not None
        (tmp_path / "a").mkdir()
        (tmp_path / "b").mkdir()
        shutil.copy(bundled / "anthropic_tokenizer.json", tmp_path / "a" / "tokenizer.json")
        word_level_tokenizer(tmp_path / "b" / "tokenizer.json")
        body = {"messages": [{"role": "user", "content": TEXT}]}

        shared = guard_for(
            tmp_path,
            model_map,
            ("model-a", tmp_path / "a" / "tokenizer.json"),
            ("model-b", tmp_path / "b" / "tokenizer.json"),
        )
        counted_a = plan_with(shared, body, "model-a").count.total
        counted_b = plan_with(shared, body, "model-b").count.total

        alone_b = plan_with(
            guard_for(tmp_path, model_map, ("model-b", tmp_path / "b" / "tokenizer.json")), body, "model-b"
        ).count.total
        alone_a = plan_with(
            guard_for(tmp_path, model_map, ("model-a", tmp_path / "a" / "tokenizer.json")), body, "model-a"
        ).count.total
        assert (counted_a, counted_b) == (alone_a, alone_b) and counted_a != counted_b

    def test_the_identity_names_the_path_and_the_content(self, tmp_path, model_map):
        word_level_tokenizer(tmp_path / "tokenizer.json")
        guard = guard_for(tmp_path, model_map, ("model-b", tmp_path / "tokenizer.json"))
        tokenizer = guard.tokenizer(guard.profile("model-b"))
        assert tokenizer.name == "hf:tokenizer.json"
        assert str(tmp_path.resolve()) in tokenizer.identity and len(tokenizer.identity.rsplit(":", 1)[-1]) == 64
