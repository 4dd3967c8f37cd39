"""A family whose vocabulary package is missing is counted with its bound, never refused.

Each test runs the guard in a child process where the package cannot be found: a
`sitecustomize` puts a finder first on `sys.meta_path` that answers ModuleNotFoundError for it,
as a venv without it would (the data-file lookup, `importlib.util.find_spec`, then finds
nothing). The counts are checked against the real tokenizer, in this process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from llama_models.llama3.tokenizer import Tokenizer as Llama3Tokenizer

from tests.support.processes import ROOT, Guard

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
TEXT = "Summarise the release notes in three bullet points, then list every breaking change. " * 20

BLOCKER = """
import sys


class _Uninstalled:
    \"\"\"Finds nothing for the packages named below, as a venv without them does.\"\"\"

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _Uninstalled())
"""


@pytest.fixture
def without_llama_models(tmp_path: Path) -> dict[str, str]:
    """The environment of a child process in which llama-models is not installed."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked={"llama_models"}))
    return {"PYTHONPATH": f"{site}:{ROOT}"}


def _run(args: list[str], env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        cwd=ROOT,
        timeout=120,
    )


def _real_llama3(text: str) -> int:
    return len(Llama3Tokenizer.get_instance().encode(text, bos=False, eos=False, allowed_special=set()))


class TestTheBlockerItself:
    def test_the_child_process_cannot_find_the_package(self, without_llama_models):
        probe = "import importlib.util as u; print(u.find_spec('llama_models') is None)"
        found = subprocess.run(
            [sys.executable, "-c", f"try:\n {probe}\nexcept ModuleNotFoundError:\n print(True)"],
            capture_output=True,
            text=True,
            env={**os.environ, **without_llama_models},
            timeout=60,
        )
        assert found.stdout.strip() == "True", found.stderr


class TestServingNeverImportsTheVocabularyPackages:
    def test_every_vocabulary_loads_and_the_app_is_built_without_importing_them(self):
        """Their data files are read; their Python code (and numpy, pillow, pydantic it pulls) is not."""
        script = (
            "import sys\n"
            "from proxy.config.settings import load_settings\n"
            "from proxy.server.process.app import create_app\n"
            "from proxy.tokenizers.family_vocabularies import VOCABULARIES, load_vocabulary\n"
            "create_app(load_settings(None))\n"
            "[load_vocabulary(name) for name in VOCABULARIES]\n"
            "print(sorted(m for m in ('llama_models', 'mistral_common', 'numpy', 'PIL') if m in sys.modules))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, timeout=300
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "[]"


class TestServingWithoutTheVocabulary:
    def test_a_request_is_answered_200_with_the_bound_and_a_note_naming_the_package(
        self, tmp_path, without_llama_models
    ):
        guard = Guard("guard", 0, tmp_path, "--upstream", "echo", "--workers", "1", env=without_llama_models)
        body = {"model": LLAMA, "messages": [{"role": "user", "content": TEXT}], "max_tokens": 50}

        async def send() -> int:
            await guard.until_ready()
            async with aiohttp.ClientSession() as session, session.post(guard.url("/v1/chat/completions"), json=body) as r:
                await r.read()
                return r.status

        guard.start()
        try:
            status = asyncio.run(send())
        finally:
            guard.stop()
        (line,) = [e for e in guard.events("request") if e.get("model") == LLAMA]
        assert status == 200
        assert "vocabulary_missing:llama-models" in line["notes"]
        assert line["tokenizer"] == "cl100k_base+bound:open" and line["exact"] is False
        assert line["tokens_before"] >= _real_llama3(TEXT)


class TestTheCommandLineWithoutTheVocabulary:
    def test_count_gives_the_bound_and_says_which_package_is_missing(self, without_llama_models):
        body = json.dumps({"model": LLAMA, "messages": [{"role": "user", "content": TEXT}]})
        done = _run(["count", "-"], without_llama_models, stdin=body)
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["tokenizer"] == "cl100k_base+bound:open" and report["exact"] is False
        assert report["prompt_tokens"] >= _real_llama3(TEXT)
        assert any("vocabulary_missing" in w and "llama-models" in w for w in report["warnings"])

    def test_check_config_warns_for_a_configured_model_and_still_passes(self, tmp_path, without_llama_models):
        config = tmp_path / "guard.yaml"
        config.write_text(
            "upstreams:\n  local:\n    base_url: http://127.0.0.1:9/v1\n"
            f"routes:\n  - match: {LLAMA}\n    upstream: local\n"
        )
        done = _run(["check-config", str(config)], without_llama_models)
        assert done.returncode == 0, done.stderr
        assert f"warning: model {LLAMA!r}" in done.stderr and "llama-models" in done.stderr
        (missing,) = json.loads(done.stdout)["vocabulary_missing"]
        assert missing == {"model": LLAMA, "vocabulary": "llama3", "package": "llama-models", "counted_with": "bound:open"}
