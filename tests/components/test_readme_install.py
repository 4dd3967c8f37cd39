"""The README's install, run as written in a fresh venv on each Python the project supports, counts
Gemini with Gemma's vocabulary (Gemma 3's, as google-genai does), with no `vocabulary_missing`.

The install lines are read from the README's "## Install" block, so the README and this test
cannot drift. They run in a copy of the checkout's tracked files (an editable install writes its
metadata beside the sources), with packages from the package index (pip's cache makes a second
run quick). An interpreter is found on PATH or under pyenv; one that is missing skips its case.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import ROOT

pytestmark = pytest.mark.components

INSTALL_SECONDS = 1500
SUPPORTED = ("3.11", "3.12")
GEMINI_BODY = {"contents": [{"role": "user", "parts": [{"text": "How many tokens is this sentence, for Gemini?"}]}]}


def install_lines() -> list[str]:
    """The shell lines of the README's install block."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Install") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None, "the README's Install section has a sh block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def interpreter(version: str) -> str | None:
    """Python `version`: this one, a pyenv install, or one on PATH (not pyenv's shim, which runs
    only the versions pyenv was told to)."""
    if sys.version_info[:2] == tuple(map(int, version.split("."))):
        return sys.executable
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    candidates = sorted(pyenv.glob(f"{version}.*/bin/python{version}")) if pyenv.is_dir() else []
    if candidates:
        return str(candidates[-1])
    found = shutil.which(f"python{version}")
    return found if found is not None and "/shims/" not in found else None


def checkout_copy(target: Path) -> Path:
    """The tracked files the install needs, as a fresh clone has them."""
    listed = subprocess.run(
        ["git", "ls-files", "pyproject.toml", "README.md", "LICENSE", "proxy", "config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in listed:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target / name)
    return target


class TestTheReadmeInstall:
    def test_its_lines_install_the_proxy_and_gemmas_vocabularies(self):
        lines = install_lines()
        assert lines[0].startswith("python3 -m venv .venv") and "pip install -e ." in lines[0]
        assert any("maxtext" in line for line in lines)

    @pytest.mark.parametrize("version", SUPPORTED)
    def test_a_fresh_venv_counts_gemini_with_gemmas_vocabulary(self, version, tmp_path):
        python = interpreter(version)
        if python is None:
            pytest.skip(f"no Python {version} here (pyenv installs one)")
        checkout = checkout_copy(tmp_path / "checkout")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV")}
        for line in install_lines():
            command = re.sub(r"^python3 ", f"{python} ", line)
            done = subprocess.run(
                ["bash", "-c", command], cwd=checkout, env=env, capture_output=True, text=True, timeout=INSTALL_SECONDS
            )
            assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
        counted = subprocess.run(
            [
                str(checkout / ".venv/bin/context-guard"),
                "count",
                "--api",
                "generate_content",
                "--model",
                "gemini-2.5-flash",
                "-",
            ],
            input=json.dumps(GEMINI_BODY),
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert counted.returncode == 0, counted.stderr
        report = json.loads(counted.stdout)
        assert report["tokenizer"] == "gemma3", report["tokenizer"]  # without it: the bound, cl100k_base+bound:...
        assert not [w for w in report["warnings"] if "vocabulary_missing" in w]
