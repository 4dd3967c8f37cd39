"""The runnable examples and the `serve` command, against a real proxy and a fake upstream."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

EXAMPLES = Path(__file__).parent.parent.parent / "examples"


async def run(*args: str, env: dict[str, str], timeout: float = 240) -> tuple[int, str, str]:
    """Run an example to its end; the bound is generous because importing an SDK (langchain's
    above all) takes a minute on a loaded two-core machine."""
    process = await asyncio.create_subprocess_exec(
        *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    return process.returncode or 0, out.decode(), err.decode()


@pytest.mark.parametrize("script", ["sdk_chat.py", "sdk_stream.py", "sdk_tools.py", "langchain_chat.py"])
async def test_example_runs_against_the_proxy(proxy, upstream, script):
    if script == "langchain_chat.py" and importlib.util.find_spec("langchain_openai") is None:
        pytest.skip("langchain-openai is not installed (the example says so)")
    env = {**os.environ, "OPENAI_BASE_URL": str(proxy.make_url("/v1")), "OPENAI_API_KEY": "sk-example"}
    code, out, err = await run(sys.executable, str(EXAMPLES / script), env=env)
    assert code == 0, err
    assert "upstream" in out or "part0" in out
    assert upstream.received


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
