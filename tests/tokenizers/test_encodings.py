"""Encodings and the model map load from local files, never from the network."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.config.settings import Settings, settings_from_dict
from proxy.core.models.model_registry import TokenizerSpec
from proxy.errors import ConfigError
from proxy.server.backends.models import Models
from proxy.tokenizers.vocabularies import Tokenizers, TokenizerUnavailable, encoding_file_name

_NO_NETWORK = (
    "import socket\n"
    "def refuse(*a, **k): raise RuntimeError('network access attempted')\n"
    "socket.socket.connect = refuse; socket.create_connection = refuse; socket.getaddrinfo = refuse\n"
)


def test_a_fresh_process_loads_both_encodings_and_the_model_map_with_the_network_cut_off():
    code = _NO_NETWORK + (
        "from proxy.server.backends.models import Models\nfrom proxy.config.settings import Settings\n"
        "g = Models(Settings())\n"
        "p = g.profile('gpt-4o'); print(g.tokenizer(p).count('hello world'), p.context_window)\n"
        "print(g.tokenizer(g.profile('gpt-4')).count('hello world'))\n"
        "import sys; print('litellm' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "128000", "2", "False"]


def test_a_missing_encoding_is_a_clear_startup_error_not_a_download(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.setattr("proxy.tokenizers.vocabularies.bundled_encodings_dir", lambda: None)
    with pytest.raises(ConfigError, match=r"o200k_base.*not on disk"):
        Tokenizers([tmp_path]).get(TokenizerSpec("tiktoken", "o200k_base"))


def test_an_operator_folder_is_searched_first(tmp_path: Path, monkeypatch):
    from proxy.tokenizers.vocabularies import bundled_encodings_dir

    bundled = bundled_encodings_dir()
    assert bundled is not None
    (tmp_path / encoding_file_name("cl100k_base")).write_bytes(
        (bundled / encoding_file_name("cl100k_base")).read_bytes()
    )
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    tokenizer = Tokenizers([tmp_path]).get(TokenizerSpec("tiktoken", "cl100k_base"))
    assert tokenizer.count("hello world") == 2


def test_a_corrupt_encoding_file_is_a_clear_error_naming_it_and_is_left_in_place(tmp_path: Path, monkeypatch):
    corrupt = tmp_path / encoding_file_name("r50k_base")
    corrupt.write_bytes(b"aGVsbG8= 0\nd29ybGQ= 1\n")
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    with pytest.raises(TokenizerUnavailable, match=rf"{corrupt}.*SHA-256 differs"):
        Tokenizers([tmp_path]).get(TokenizerSpec("tiktoken", "r50k_base"))
    assert corrupt.read_bytes() == b"aGVsbG8= 0\nd29ybGQ= 1\n"


def test_a_hugging_face_tokenizer_file_loads(tmp_path: Path):
    from proxy.tokenizers.vocabularies import bundled_encodings_dir

    claude = bundled_encodings_dir() / "anthropic_tokenizer.json"  # a real tokenizer.json that litellm ships
    tokenizer = Tokenizers().get(TokenizerSpec("huggingface", str(claude)))
    assert tokenizer.count("hello world") >= 2
    with pytest.raises(ConfigError, match="does not exist"):
        Tokenizers().get(TokenizerSpec("huggingface", str(tmp_path / "missing.json")))


class TestLazyVocabularies:
    def test_a_guard_with_no_model_named_in_its_config_loads_no_vocabulary_at_start(self):
        guard = Models(Settings())
        assert guard.tokenizers.loaded == ()

    def test_a_vocabulary_loads_when_a_model_that_needs_it_is_first_counted(self):
        guard = Models(Settings())
        assert guard.tokenizer(guard.profile("gpt-4o")).count("hello world") == 2
        assert guard.tokenizers.loaded == (TokenizerSpec("tiktoken", "o200k_base"),)

    def test_the_models_a_config_routes_by_name_load_their_vocabulary_at_start(self):
        settings = settings_from_dict(
            {
                "upstreams": {"up": {"base_url": "http://127.0.0.1:9"}},
                "routes": [{"match": "gpt-4o", "upstream": "up"}, {"match": "claude-*", "upstream": "up"}],
            },
            "cg.yaml",
            {},
        )
        assert Models(settings).tokenizers.loaded == (TokenizerSpec("tiktoken", "o200k_base"),)

    def test_a_guard_built_to_serve_checks_the_configured_files_at_once_and_loads_them_when_asked(self):
        settings = settings_from_dict(
            {
                "upstreams": {"up": {"base_url": "http://127.0.0.1:9"}},
                "routes": [{"match": "gpt-4o", "upstream": "up"}],
            },
            "cg.yaml",
            {},
        )
        guard = Models(settings, preload=False)
        assert guard.tokenizers.loaded == ()
        guard.load_configured()
        assert guard.tokenizers.loaded == (TokenizerSpec("tiktoken", "o200k_base"),)

    @pytest.mark.parametrize("preload", [True, False])
    def test_a_configured_model_whose_vocabulary_is_missing_stops_the_start(
        self, monkeypatch, tmp_path: Path, preload: bool
    ):
        monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
        monkeypatch.setattr("proxy.tokenizers.vocabularies.bundled_encodings_dir", lambda: None)
        settings = settings_from_dict(
            {
                "tokenizers": {"encodings_dir": str(tmp_path)},
                "upstreams": {"up": {"base_url": "http://127.0.0.1:9"}},
                "routes": [{"match": "gpt-4o", "upstream": "up"}],
            },
            "cg.yaml",
            {},
        )
        with pytest.raises(ConfigError, match=r"o200k_base.*not on disk"):
            Models(settings, preload=preload)

    def test_a_missing_vocabulary_first_needed_by_a_request_is_a_503_error_for_that_request(
        self, monkeypatch, tmp_path: Path
    ):
        monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
        monkeypatch.setattr("proxy.tokenizers.vocabularies.bundled_encodings_dir", lambda: None)
        guard = Models(Settings())
        with pytest.raises(TokenizerUnavailable, match=r"o200k_base.*not on disk") as raised:
            guard.tokenizer(guard.profile("gpt-4o"))
        assert raised.value.status == 503
        assert raised.value.to_openai()["error"]["code"] == "tokenizer_unavailable"


class TestSingleCopyOfRanks:
    def test_a_loaded_encoding_counts_exactly_as_tiktoken_s_own(self, monkeypatch):
        import tiktoken

        from proxy.tokenizers.vocabularies import bundled_encodings_dir

        monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(bundled_encodings_dir()))  # tiktoken's own, offline
        text = (Path(__file__).parents[1] / "data/samples/code.py.txt").read_text(encoding="utf-8")
        ours = Tokenizers().get(TokenizerSpec("tiktoken", "cl100k_base"))
        assert ours.count(text) == len(tiktoken.get_encoding("cl100k_base").encode_ordinary(text))

    @pytest.mark.parametrize("name", ["cl100k_base", "o200k_base"])
    def test_the_ranks_read_are_those_tiktoken_s_own_reader_reads(self, name, monkeypatch):
        from tiktoken.load import load_tiktoken_bpe

        from proxy.tokenizers.vocabularies import _ranks_reader, bundled_encodings_dir

        folder = bundled_encodings_dir()
        monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(folder))
        url = f"https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
        assert _ranks_reader(folder)(url) == load_tiktoken_bpe(url)

    def test_a_loaded_encoding_keeps_no_python_copy_of_its_ranks(self):
        from proxy.tokenizers.vocabularies import _ENCODINGS

        Tokenizers().get(TokenizerSpec("tiktoken", "o200k_base"))
        encodings = [e for (name, _), e in _ENCODINGS.items() if name == "o200k_base"]
        # tiktoken keeps the dict it was built from only to pickle itself; the Rust copy encodes.
        assert encodings and all(len(e._mergeable_ranks) == 0 for e in encodings)

def write_gguf(path: Path, metadata: dict[str, object]) -> Path:
    """A GGUF v3 file holding `metadata` (strings, ints, bools, lists of those) and no tensors."""
    import struct

    def string(text: str) -> bytes:
        raw = text.encode()
        return struct.pack("<Q", len(raw)) + raw

    def value(v: object) -> tuple[int, bytes]:
        if isinstance(v, bool):
            return 7, struct.pack("<?", v)
        if isinstance(v, int):
            return 5, struct.pack("<i", v)
        if isinstance(v, str):
            return 8, string(v)
        assert isinstance(v, list) and v
        kind = value(v[0])[0]
        return 9, struct.pack("<IQ", kind, len(v)) + b"".join(value(item)[1] for item in v)

    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(metadata))
    for key, v in metadata.items():
        kind, raw = value(v)
        body += string(key) + struct.pack("<I", kind) + raw
    path.write_bytes(body)
    return path


# A byte-level BPE vocabulary small enough to reason about: bytes "a", "b", "Ġ" (space), "1", "2",
# a merge "a b" -> "ab", and a control token. The "smollm" pre-tokenizer splits digits one by one.
TINY_VOCAB = {
    "general.name": "tiny",
    "tokenizer.ggml.model": "gpt2",
    "tokenizer.ggml.pre": "smollm",
    "tokenizer.ggml.tokens": ["<|end|>", "a", "b", "Ġ", "1", "2", "ab", "Ġab"],
    "tokenizer.ggml.token_type": [3, 1, 1, 1, 1, 1, 1, 1],
    "tokenizer.ggml.merges": ["a b", "Ġ ab"],
    "tokenizer.ggml.add_bos_token": False,
}


class TestGgufVocabulary:
    def test_a_gguf_file_vocabulary_loads_as_a_hugging_face_tokenizer(self, tmp_path: Path):
        path = write_gguf(tmp_path / "tiny.gguf", TINY_VOCAB)
        tokenizer = Tokenizers().get(TokenizerSpec("huggingface", str(path)))
        assert tokenizer.exact
        assert tokenizer.count("ab ab") == 2  # "ab", "Ġab"
        assert tokenizer.count("12") == 2  # digits split one by one
        assert tokenizer.count("<|end|>") == 1  # a control token is matched whole

    def test_a_vocabulary_of_an_unsupported_kind_is_a_clear_error(self, tmp_path: Path):
        path = write_gguf(tmp_path / "wpm.gguf", {**TINY_VOCAB, "tokenizer.ggml.model": "bert"})
        with pytest.raises(ConfigError, match=r"'bert' tokenizer; supported: byte-level BPE"):
            Tokenizers().get(TokenizerSpec("huggingface", str(path)))

    def test_an_unknown_pre_tokenizer_is_a_clear_error_listing_the_known_ones(self, tmp_path: Path):
        path = write_gguf(tmp_path / "odd.gguf", {**TINY_VOCAB, "tokenizer.ggml.pre": "odd"})
        with pytest.raises(ConfigError, match=r"pre-tokenizer 'odd'.*known: .*smollm"):
            Tokenizers().get(TokenizerSpec("huggingface", str(path)))

    def test_a_file_that_is_not_gguf_is_a_clear_error(self, tmp_path: Path):
        path = tmp_path / "fake.gguf"
        path.write_bytes(b"not a model")
        with pytest.raises(ConfigError, match="is not a GGUF file"):
            Tokenizers().get(TokenizerSpec("huggingface", str(path)))
