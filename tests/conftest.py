"""Shared fixtures: the real model map and real encodings, loaded once per test session."""

from __future__ import annotations

import base64
import struct
from collections.abc import Callable
from typing import Any

import pytest

from proxy.core.models import ModelRegistry
from proxy.core.request_count import RequestCounter
from proxy.tokenizers.model_map import load_model_map
from proxy.tokenizers.vocabularies import Tokenizers


@pytest.fixture(scope="session")
def model_map() -> dict[str, dict[str, Any]]:
    return load_model_map()


@pytest.fixture(scope="session")
def registry(model_map: dict[str, dict[str, Any]]) -> ModelRegistry:
    return ModelRegistry(model_map)


@pytest.fixture(scope="session")
def tokenizers() -> Tokenizers:
    return Tokenizers()


@pytest.fixture(scope="session")
def counter_for(registry: ModelRegistry, tokenizers: Tokenizers) -> Callable[[str], RequestCounter]:
    def make(model: str) -> RequestCounter:
        profile = registry.profile(model)
        return RequestCounter(profile, tokenizers.get(profile.tokenizer))

    return make


def png_data_url(width: int, height: int) -> str:
    """A data URL whose bytes start like a real PNG of that size (header only; no pixels)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + b"\0\0\0\0" + b"\0" * 64
    return "data:image/png;base64," + base64.b64encode(data).decode()
