"""The real backend, started once for the session; and a guard in front of it, per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.real.llama import LlamaServer, running_server


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with running_server(log) as server:
        yield server


@pytest.fixture(scope="session")
def gguf(llama: LlamaServer) -> Path:
    return llama.gguf


def usage_prompt_tokens(answer: dict[str, Any]) -> int:
    prompt = answer["usage"]["prompt_tokens"]
    assert isinstance(prompt, int)
    return prompt
