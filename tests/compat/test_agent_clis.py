"""Claude Code and Codex CLI, the real agent clients from the npm registry (pinned and installed by
scripts/install-agent-clis.sh, which `make test-compat` runs first), driven through the guard
against a scripted model: one prompt, 30 shell calls each printing a real file of 14-24 KB, then a
final answer. Each CLI runs offline in a subprocess: its only server is the guard on loopback
(any other address goes to a closed port through HTTP(S)_PROXY), in a throw-away home.

The loop runs at windows far smaller than it needs whole (`LOOP_WINDOWS`: 64k for Claude Code, 32k
for Codex, where the 31 requests reach about 200k tokens): the guard clears old tool results inside
the turn (proxy.core.trimming.clearing), so it completes with no refusal it cannot recover from and no
compaction, and every forwarded body is within the budget by an independent count (o200k_base
directly, on the body as the model received it). Before the guard cleared results inside the turn,
an agent loop was one protected turn: at 64k Claude Code was refused mid-loop and compacted its own
history. Below what the newest results need (`TOO_SMALL`: Codex at 16k, where its instructions,
tools and newest three results are over the budget) the guard refuses in the API's words, and
Codex stops short of the answer.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.compat.agent_model import FINAL_ANSWER, AgentModel, Served, guarded, independent_tokens
from tests.compat.conftest import Servers

STEPS = 30
CLAUDE_MODEL, CODEX_MODEL = "claude-sonnet-4-6", "gpt-5.5"
PROMPT = "Read the files one by one with the shell, then say that you are done."
# Claude Code: about 23,000 tokens of tools and system prompt, 32,000 of max_tokens; Codex: about
# 7,600 and no max_output_tokens. Each of the 30 results is 14-24 KB.
LOOP_WINDOWS = {"claude": 64_000, "codex": 32_000}
TOO_SMALL = {"codex": 16_000}


def clis() -> Path:
    folder = os.environ.get("CONTEXT_GUARD_AGENT_CLIS")
    if not folder:
        pytest.skip("the agent CLIs are installed by `make test-compat` (scripts/install-agent-clis.sh)")
    return Path(folder)


def offline_env(home: Path) -> dict[str, str]:
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, so any outside call fails at once
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "HTTP_PROXY": closed,
        "HTTPS_PROXY": closed,
        "http_proxy": closed,
        "https_proxy": closed,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def run_claude(served: Served, home: Path) -> subprocess.CompletedProcess[str]:
    env = offline_env(home) | {
        "ANTHROPIC_BASE_URL": served.root,
        "ANTHROPIC_API_KEY": "sk-ant-offline",
        "ANTHROPIC_MODEL": CLAUDE_MODEL,
        "ANTHROPIC_SMALL_FAST_MODEL": CLAUDE_MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": CLAUDE_MODEL,
        "IS_SANDBOX": "1",  # as root, --dangerously-skip-permissions needs it
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    command = [str(clis() / "claude"), "-p", PROMPT, "--dangerously-skip-permissions", "--model", CLAUDE_MODEL]
    return subprocess.run(command, env=env, cwd=home, capture_output=True, text=True, timeout=900, check=False)


def run_codex(served: Served, home: Path) -> subprocess.CompletedProcess[str]:
    codex_home = home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        f'model = "{CODEX_MODEL}"\n'
        'model_provider = "guard"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "check_for_update_on_startup = false\n"
        "[model_providers.guard]\n"
        'name = "guard"\n'
        f'base_url = "{served.root}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "GUARD_API_KEY"\n',
        encoding="utf-8",
    )
    env = offline_env(home) | {"CODEX_HOME": str(codex_home), "GUARD_API_KEY": "sk-offline"}
    command = [str(clis() / "codex"), "exec", "--skip-git-repo-check", PROMPT]
    return subprocess.run(command, env=env, cwd=home, capture_output=True, text=True, timeout=900, check=False)


RUNS = {"claude": (run_claude, CLAUDE_MODEL), "codex": (run_codex, CODEX_MODEL)}


def drive(servers: Servers, cli: str, window: int) -> tuple[subprocess.CompletedProcess[str], Served, AgentModel]:
    run, model_name = RUNS[cli]
    model = AgentModel(steps=STEPS)
    with guarded(model, window, (model_name,), servers.logs) as served, tempfile.TemporaryDirectory() as home:
        return run(served, Path(home)), served, model


def input_budget(window: int, body: dict[str, Any]) -> int:
    """docs/trimming.md's budget, written out here: the window less the output the request asks for
    (else 15% of the window, 500 to 4,096) and the 5% safety margin."""
    asked = body.get("max_tokens") or body.get("max_output_tokens")
    reserve = asked if isinstance(asked, int) else max(500, min(4096, int(window * 0.15)))
    return window - reserve - math.ceil(window * 0.05)


@pytest.mark.parametrize("cli", ["claude", "codex"])
class TestAgentLoop:
    def test_the_30_call_loop_completes_with_every_body_within_the_budget(self, cli: str, servers: Servers) -> None:
        window = LOOP_WINDOWS[cli]
        done, served, model = drive(servers, cli, window)
        assert done.returncode == 0, done.stderr[-2000:]
        assert FINAL_ANSWER in done.stdout and model.calls == STEPS and model.compactions == 0
        assert len(model.loop_bodies) == STEPS + 1
        for body in model.loop_bodies:
            assert independent_tokens(body) <= input_budget(window, body)
        for body, path in zip(model.loop_bodies[1:], model.files, strict=True):  # each output reached the model
            assert json.dumps(path.read_text(encoding="utf-8")[:200])[1:-1] in json.dumps(body), path
        # A refusal the client recovers from (Claude Code's max_tokens, lowered on Anthropic's sentence)
        # is answered by its retry; none ends the loop.
        events = served.log_events()
        assert events[-1]["status"] == 200
        assert all(b["status"] == 200 for a, b in itertools.pairwise(events) if a["status"] != 200)


class TestBelowWhatTheNewestResultsNeed:
    """The newest exchanges are kept verbatim: a window they cannot fit is refused, not emptied."""

    def test_codex_is_refused_and_stops_short_of_the_answer(self, servers: Servers) -> None:
        done, served, model = drive(servers, "codex", TOO_SMALL["codex"])
        refused = [e for e in served.log_events() if e.get("outcome") == "rejected"]
        assert refused and refused[-1]["status"] == 400
        assert done.returncode != 0 and model.calls < STEPS and FINAL_ANSWER not in done.stdout


class TestClaudeCodeAtTheWindowsEdge:
    def test_it_lowers_max_tokens_on_anthropics_sentence_and_the_loop_goes_on(self, servers: Servers) -> None:
        """Its 32,000 `max_tokens` does not fit a 64k window beside its 23k-token prompt: refused in
        Anthropic's words, it reads the numbers, lowers `max_tokens` and sends again at once."""
        _, served, model = drive(servers, "claude", LOOP_WINDOWS["claude"])
        first, second = served.log_events()[:2]
        assert (first["outcome"], first["status"], second["status"]) == ("rejected", 400, 200)
        assert model.received[0].body["max_tokens"] < 32_000 and model.calls > 1
