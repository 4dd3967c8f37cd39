"""`context-guard check-config` against `context-guard serve`: the same settings, the same start
rules, the same verdict, on every example and on configurations serve refuses to start."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.cli import main
from tests.support.processes import ROOT, Guard

EXAMPLES = ROOT / "examples"
CONFIGS = sorted(EXAMPLES.glob("*.yaml"))
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.endswith(("_API_KEY", "_KEY")) and k not in ("HOST", "PORT")}


def env_for(path: Path) -> dict[str, str]:
    """Every variable an example reads (`${VAR}`, `api_key_env: VAR`), set to a dummy value."""
    text = path.read_text(encoding="utf-8")
    names = re.findall(r"\$\{(\w+)", text) + re.findall(r"api_key_env:\s*(\w+)", text)
    return {**CLEAN_ENV, **dict.fromkeys(names, "example-dummy")}


def check_config(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "check-config", *args],
        env={**env, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def serve_refusal(tmp_path: Path, *args: str, env: dict[str, str]) -> tuple[int, str]:
    """`serve` with `args`, which must refuse to start: its exit status and what it wrote."""
    guard = Guard("refused", 0, tmp_path, "--workers", "1", *args, env=env).start()
    try:
        return guard.wait(120), guard.output
    finally:
        guard.kill()


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "cg.yaml"
    path.write_text(text)
    return str(path)


OPEN_RELAY = "server:\n  host: 0.0.0.0\nupstreams:\n  openai:\n    base_url: https://api.openai.com/v1\n    kind: openai\n    api_key_env: OPENAI_API_KEY\n"
TWO_MISSING = (
    'server:\n  client_keys: ["${CG_TEAM_KEY}"]\nupstreams:\n  u:\n    base_url: "http://${CG_UPSTREAM_HOST}/v1"\n'
)
REFUSED = {
    "open credential relay": (OPEN_RELAY, {"OPENAI_API_KEY": "sk-test"}, (), "injecting the credential of upstream(s) openai"),
    "two variables missing": (TWO_MISSING, {}, (), "environment variables CG_TEAM_KEY, CG_UPSTREAM_HOST are not set"),
    "a port that is not a number": ("server:\n  port: lots\n", {}, (), "server.port: must be a whole number"),
    "no worker": ("", {}, ("--workers", "0"), "server.workers must be between 1 and 256"),
    "a model map that is not there": ("models:\n  map_file: /nonexistent/models.yaml\n", {}, (), "/nonexistent/models.yaml"),
    "a tokenizer that cannot load": (
        'models:\n  overrides:\n    - {match: m, tokenizer: "tiktoken:p50k*1.1"}\n', {}, (), "models.overrides[0].tokenizer"
    ),
}  # fmt: skip


class TestCheckConfigAndServeAgree:
    @pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
    async def test_every_example_is_valid_to_both_and_serve_starts_it(self, path, tmp_path):
        env = env_for(path)
        checked = check_config("--config", str(path), "--host", "127.0.0.1", "--workers", "1", env=env)
        assert checked.returncode == 0, checked.stderr
        assert json.loads(checked.stdout)["valid"] is True
        guard = Guard("example", 0, tmp_path, "--config", str(path), "--host", "127.0.0.1", "--workers", "1", env=env)
        guard.start()
        try:
            await guard.until_ready(path="/livez")
            listening = await guard.logged("listening")
        finally:
            guard.stop()
        assert listening["config"] == str(path) and guard.wait(30) == 0

    @pytest.mark.parametrize("case", REFUSED, ids=str)
    def test_a_config_serve_refuses_is_refused_by_check_config_with_the_same_reason(self, case, tmp_path):
        text, variables, flags, reason = REFUSED[case]
        env, config = {**CLEAN_ENV, **variables}, write(tmp_path, text)
        checked = check_config("--config", config, *flags, env=env)
        code, served = serve_refusal(tmp_path, "--config", config, *flags, env=env)
        assert (checked.returncode, code) == (2, 2), (checked.stderr, served)
        assert checked.stdout == "" and reason in checked.stderr and reason in served


class TestCheckConfig:
    def test_the_file_may_be_given_as_an_argument_or_with_config_as_serve_takes_it(self, capsys, tmp_path):
        config = write(tmp_path, "server:\n  port: 9001\n")
        assert main(["check-config", config]) == 0
        positional = json.loads(capsys.readouterr().out)
        assert main(["check-config", "--config", config]) == 0
        assert json.loads(capsys.readouterr().out) == positional
        assert positional["listen"] == "http://127.0.0.1:9001"

    def test_it_shows_what_the_file_sets_and_every_setting_only_when_asked(self, capsys, tmp_path):
        config = write(tmp_path, "server:\n  port: 9001\nlog:\n  level: debug\n")
        assert main(["check-config", config]) == 0
        assert json.loads(capsys.readouterr().out)["settings"] == {"server": {"port": 9001}, "log": {"level": "debug"}}
        assert main(["check-config", config, "--defaults"]) == 0
        everything = json.loads(capsys.readouterr().out)["settings"]
        assert everything["server"]["port"] == 9001 and everything["server"]["host"] == "127.0.0.1"
        assert {"budget", "trim", "tokenizers", "page"} <= set(everything)

    def test_every_missing_variable_is_named_at_once_with_its_key(self, capsys, tmp_path):
        code = main(["check-config", write(tmp_path, TWO_MISSING)])
        err = capsys.readouterr().err
        assert code == 2 and err.count("\n") == 1
        assert "server.client_keys[0]: CG_TEAM_KEY" in err and "upstreams.u.base_url: CG_UPSTREAM_HOST" in err

    def test_it_reports_the_warnings_serve_logs_at_start(self, capsys, monkeypatch, tmp_path):
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        assert main(["check-config"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert [w["event"] for w in report["warnings"]] == ["upstream_key_missing"]

    def test_the_echo_upstream_uses_no_key_and_is_served_by_one_process(self, capsys, monkeypatch):
        monkeypatch.delenv("OPENAI_API_KEY", raising=False)
        assert main(["check-config", "--upstream", "echo"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["warnings"] == [] and report["workers"] == 1
        assert report["settings"]["upstreams"] == {"echo": {"kind": "echo"}}
