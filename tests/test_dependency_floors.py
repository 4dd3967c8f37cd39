"""pyproject.toml's dependency floors are at least what the code needs.

Each row of NEEDED is a fact found by installing the floors (scripts/check-floors.sh builds a venv
with every runtime dependency at its declared floor and runs the suite there): the first release
that has what the code uses, and what that is. Lowering a floor below a row fails here, in a
second, instead of on a user's machine with old packages.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"

# package -> (the lowest version that works, and why: what the code needs from it, or who requires it)
NEEDED: dict[str, tuple[str, str]] = {
    "aiohttp": ("3.14.0", "web.RequestKey (proxy/server/edge/paths.py); 3.13.5 has no such name"),
    "litellm": (
        "1.93.0",
        "its model map knows the models the suite counts exactly: gpt-5.6-sol first appears in 1.93.0 "
        "(1.55.0 is the first with the tiktoken files at litellm_core_utils/tokenizers/, which "
        "proxy/encodings.py reads; older maps lack gpt-4.1, gpt-5, o3-mini and gemini-2.5-pro too)",
    ),
    "tokenizers": (
        "0.21.0",
        "litellm 1.93.0 requires it; the code alone needs 0.20.0: 0.19.1 cannot read the tokenizer.json "
        "proxy/gguf_vocab.py writes (merges as pairs, `ignore_merges`)",
    ),
    "tiktoken": ("0.8.0", "litellm 1.93.0 requires it"),
    "structlog": ("24.1.0", "the first release of 24: there is no 24.0.0, so the floor `24` installs nothing"),
    "openai": ("2.20.0", "litellm 1.93.0 requires it (and 1.55.3 is the first that works with httpx 0.28)"),
    "botocore": (
        "1.34.0",
        "installed alone at 1.34.0 on Python 3.11, SigV4Auth signs a bedrock request (the session token included) "
        "and RefreshableCredentials.refresh_needed exists: what proxy/providers/bedrock_sigv4.py uses",
    ),
}


def _runtime_requirements() -> dict[str, Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    requirements = (Requirement(spec) for spec in project["dependencies"])
    return {re.sub(r"[-_.]+", "-", req.name).lower(): req for req in requirements}


def _floor(requirement: Requirement) -> Version | None:
    floors = [Version(spec.version) for spec in requirement.specifier if spec.operator == ">="]
    return max(floors, default=None)


class TestDependencyFloors:
    def test_every_runtime_dependency_states_a_floor(self) -> None:
        missing = [name for name, req in _runtime_requirements().items() if _floor(req) is None]
        assert missing == []

    @pytest.mark.parametrize("package", sorted(NEEDED))
    def test_the_floor_is_at_least_the_first_version_with_what_the_code_uses(self, package: str) -> None:
        requirements = _runtime_requirements()
        assert package in requirements, f"{package} is no longer a runtime dependency: drop its row"
        needed, reason = NEEDED[package]
        floor = _floor(requirements[package])
        assert floor is not None and floor >= Version(needed), f"{package}>={needed} is needed: {reason}"

    @pytest.mark.parametrize("package", sorted(NEEDED))
    def test_the_needed_version_is_allowed_by_the_upper_bound(self, package: str) -> None:
        """A floor raised past an upper bound (litellm has one) would leave nothing to install."""
        assert Version(NEEDED[package][0]) in _runtime_requirements()[package].specifier
