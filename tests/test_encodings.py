"""Encodings and the model map load from local files, never from the network."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.core.models import TokenizerSpec
from proxy.encodings import Tokenizers, encoding_file_name
from proxy.errors import ConfigError

_NO_NETWORK = (
    "import socket\n"
    "def refuse(*a, **k): raise RuntimeError('network access attempted')\n"
    "socket.socket.connect = refuse; socket.create_connection = refuse; socket.getaddrinfo = refuse\n"
)


def test_a_fresh_process_loads_both_encodings_and_the_model_map_with_the_network_cut_off():
    code = _NO_NETWORK + (
        "from proxy.guard import Guard\nfrom proxy.settings import Settings\n"
        "g = Guard(Settings())\n"
        "p = g.profile('gpt-4o'); print(g.tokenizer(p).count('hello world'), p.context_window)\n"
        "import sys; print('litellm' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TIKTOKEN_CACHE_DIR"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "128000", "False"]


def test_a_missing_encoding_is_a_clear_startup_error_not_a_download(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    monkeypatch.setattr("proxy.encodings.bundled_encodings_dir", lambda: None)
    with pytest.raises(ConfigError, match=r"o200k_base.*not on disk"):
        Tokenizers([tmp_path]).get(TokenizerSpec("tiktoken", "o200k_base"))


def test_an_operator_folder_is_searched_first(tmp_path: Path, monkeypatch):
    from proxy.encodings import bundled_encodings_dir

    bundled = bundled_encodings_dir()
    assert bundled is not None
    (tmp_path / encoding_file_name("cl100k_base")).write_bytes(
        (bundled / encoding_file_name("cl100k_base")).read_bytes()
    )
    monkeypatch.delenv("TIKTOKEN_CACHE_DIR", raising=False)
    tokenizer = Tokenizers([tmp_path]).get(TokenizerSpec("tiktoken", "cl100k_base"))
    assert tokenizer.count("hello world") == 2
    assert os.environ["TIKTOKEN_CACHE_DIR"] == str(tmp_path)


def test_a_hugging_face_tokenizer_file_loads(tmp_path: Path):
    from proxy.encodings import bundled_encodings_dir

    claude = bundled_encodings_dir() / "anthropic_tokenizer.json"  # a real tokenizer.json that litellm ships
    tokenizer = Tokenizers().get(TokenizerSpec("huggingface", str(claude)))
    assert tokenizer.count("hello world") >= 2
    with pytest.raises(ConfigError, match="does not exist"):
        Tokenizers().get(TokenizerSpec("huggingface", str(tmp_path / "missing.json")))
