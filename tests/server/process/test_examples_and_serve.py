"""The runnable examples (every script in examples/, found by its suffix, through the guard in front
of the echo upstream) and the `serve` command, against a real proxy and a fake upstream."""

from __future__ import annotations

import ast
import asyncio
import importlib.util
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

from proxy.config.settings import Settings
from proxy.demo.echo import running_echo, with_echo_upstream

EXAMPLES = Path(__file__).parents[3] / "examples"


async def run(*args: str, env: dict[str, str], timeout: float = 240) -> tuple[int, str, str]:
    """Run an example to its end; the bound is generous because importing an SDK (langchain's
    above all) takes a minute on a loaded two-core machine."""
    process = await asyncio.create_subprocess_exec(
        *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    return process.returncode or 0, out.decode(), err.decode()


SCRIPTS = sorted(p for p in EXAMPLES.iterdir() if p.suffix in (".py", ".sh"))
ECHOED = "Echo from context-guard's testing upstream"


def missing_modules(script: Path) -> list[str]:
    """The top-level modules a Python example imports that are not installed here."""
    if script.suffix != ".py":
        return []
    names = set()
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return sorted(name for name in names if importlib.util.find_spec(name) is None)


class TestEveryExampleScript:
    def test_every_file_in_examples_is_a_config_or_a_script_the_suite_runs(self):
        """YAML configs are served by tests/server/process/test_example_configs.py, scripts here."""
        assert sorted({p.suffix for p in EXAMPLES.iterdir() if p.is_file()} - {".yaml", ".py", ".sh"}) == []
        assert len(SCRIPTS) >= 9

    @pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
    async def test_it_runs_to_its_end_through_the_guard_in_front_of_the_echo_upstream(self, start_proxy, script):
        """As its docstring says to run it (`context-guard serve --upstream echo`, then the
        example with its SDK's base URL on the guard): it exits 0, what it prints is the echo's
        account of a valid conversation, and every guard header it prints was there."""
        if missing := missing_modules(script):
            pytest.skip(f"{script.name} needs {', '.join(missing)} (the dev extra installs them)")
        if script.suffix == ".sh" and shutil.which("curl") is None:
            pytest.skip("curl is not installed (scripts/install-components.sh installs it)")
        async with running_echo() as echo:
            proxy = await start_proxy(with_echo_upstream(Settings(), echo))
            root = str(proxy.make_url("")).rstrip("/")
            env = {name: value for name, value in os.environ.items() if not name.endswith(("_API_KEY", "_BASE_URL"))}
            env |= {
                "OPENAI_BASE_URL": f"{root}/v1",
                "OPENAI_API_KEY": "sk-example",
                "AZURE_OPENAI_ENDPOINT": root,
                "AZURE_OPENAI_API_KEY": "example",
                "ANTHROPIC_BASE_URL": root,
                "GEMINI_BASE_URL": root,
            }
            command = [sys.executable, str(script)] if script.suffix == ".py" else ["sh", str(script)]
            code, out, err = await run(*command, env=env)
        assert code == 0, err
        assert ECHOED in out and "The conversation is valid." in out and "INVALID" not in out, out
        assert "None" not in out  # a header the example prints with .get() was missing
        if script.suffix == ".sh":
            assert "x-context-guard-tokens-before:" in out.lower()


async def listening_port(stderr: asyncio.StreamReader, lines: list[str]) -> int:
    """The port `serve --port 0` bound, from its `listening` log line (the lines read go to `lines`)."""
    while line := (await stderr.readline()).decode():
        lines.append(line)
        if line.startswith("{") and json.loads(line)["event"] == "listening":
            return int(json.loads(line)["port"])
    raise AssertionError("serve ended without listening:\n" + "".join(lines))


async def test_the_serve_command_starts_forwards_and_stops(upstream):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "proxy",
        "serve",
        "--port",
        "0",  # the process binds a port of its own choosing and logs it: none to race for
        "--upstream",
        upstream.url,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    lines: list[str] = []
    try:
        assert process.stderr is not None
        port = await asyncio.wait_for(listening_port(process.stderr, lines), 60)
        async with aiohttp.ClientSession() as session:
            body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
                assert r.status == 200 and r.headers["x-context-guard-tokens-before"] == "8"
    finally:
        process.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0, err.decode()
    events = [json.loads(line)["event"] for line in [*lines, *err.decode().splitlines()] if line.startswith("{")]
    assert "listening" in events and "request" in events


async def test_serve_with_a_bad_config_exits_2_naming_file_and_key(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("server:\n  port: lots\n")
    code, _, err = await run(sys.executable, "-m", "proxy", "serve", "--config", str(config), env=dict(os.environ))
    assert code == 2 and f"{config}: server.port: must be a whole number" in err
