"""Claude Code in its Bedrock mode (`CLAUDE_CODE_USE_BEDROCK=1`, `ANTHROPIC_BEDROCK_BASE_URL` at the
guard, `CLAUDE_CODE_SKIP_BEDROCK_AUTH=1`: the guard holds the AWS credentials) completing a tool loop
through the guard, against a fake Bedrock that verifies the guard's SigV4 signature and answers
InvokeModelWithResponseStream with a shell call, then a final answer."""

from __future__ import annotations

import os
import subprocess
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest

from tests.compat.threaded_guard import guard_in_thread
from tests.support.bedrock_upstream import (
    GUARD_AWS_ENV,
    REGION,
    FakeBedrock,
    ToolCall,
)

MODEL = "us.anthropic.claude-sonnet-4-5-20250929-v1:0"
MARKER = "guarded-bedrock-tool-ran"
FINAL = "All done through Bedrock."
AWS_ENV = GUARD_AWS_ENV


def claude() -> Path:
    folder = os.environ.get("CONTEXT_GUARD_AGENT_CLIS")
    if not folder:
        pytest.skip("the agent CLIs are installed by `make test-compat` (scripts/install-agent-clis.sh)")
    return Path(folder) / "claude"


def bedrock_guard(fake: FakeBedrock, window: int) -> AbstractContextManager[str]:
    """The guard (its own AWS credentials from its environment) in front of `fake`, both on loopback
    in a background thread; its root URL."""

    def bedrock(root: str) -> dict[str, Any]:
        return {"kind": "bedrock", "base_url": root, "region": REGION, "auth": "sigv4", "read_timeout": 60}

    return guard_in_thread(fake.app(), window, ["*claude-sonnet-4-5*"], upstream_settings=bedrock)


def run_claude_on_bedrock(root: str, home: Path) -> subprocess.CompletedProcess[str]:
    closed = "http://127.0.0.1:9"  # nothing listens: any call past the guard fails at once
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
        "HTTP_PROXY": closed, "HTTPS_PROXY": closed, "http_proxy": closed, "https_proxy": closed,
        "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
        "CLAUDE_CODE_USE_BEDROCK": "1", "ANTHROPIC_BEDROCK_BASE_URL": root, "CLAUDE_CODE_SKIP_BEDROCK_AUTH": "1",
        "AWS_REGION": REGION, "ANTHROPIC_MODEL": MODEL, "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": MODEL,
        "IS_SANDBOX": "1", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }  # fmt: skip
    prompt = "Run the shell command the task needs, then say that you are done."
    command = [str(claude()), "-p", prompt, "--dangerously-skip-permissions", "--model", MODEL]
    return subprocess.run(command, env=env, cwd=home, capture_output=True, text=True, timeout=600, check=False)


class TestClaudeCodeOnBedrock:
    def test_a_tool_loop_completes_through_the_guard_signed_with_its_credentials(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        for name, value in AWS_ENV.items():
            monkeypatch.setenv(name, value)
        command = {"command": f"echo {MARKER}", "description": "Print the marker"}
        fake = FakeBedrock(window=64_000, script=[ToolCall("Bash", command), FINAL])
        with bedrock_guard(fake, 64_000) as root, tempfile.TemporaryDirectory() as home:
            done = run_claude_on_bedrock(root, Path(home))
        assert done.returncode == 0, done.stderr[-2000:]
        assert FINAL in done.stdout and fake.refused == [] and fake.script == []
        answered: Any = fake.loop_bodies[-1]["messages"][-1]["content"]
        assert MARKER in str(answered)  # the shell's output reached the model, signed by the guard
        assert {r.operation for r in fake.received} <= {"invoke", "invoke-with-response-stream"}
