"""The image's entrypoint, run as `docker run IMAGE` would run it (no Docker needed): the Dockerfile's
ENV, ENTRYPOINT and CMD (the image's config/docker.yaml) or the arguments that replace it; then its
HEALTHCHECK."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.support.processes import Process, free_port

pytestmark = pytest.mark.components

ROOT = Path(__file__).parent.parent.parent
DOCKERFILE = (ROOT / "Dockerfile").read_text()


def dockerfile_env() -> dict[str, str]:
    block = re.search(r"^ENV (HOST=.+?)$\n(?!\s)", DOCKERFILE, flags=re.M | re.S)
    assert block is not None
    return dict(pair.split("=", 1) for pair in block.group(1).replace("\\\n", " ").split())


def health_check(env: dict[str, str]) -> int:
    command = json.loads(re.search(r"HEALTHCHECK .*?CMD (\[[^\n]+\])", DOCKERFILE, flags=re.S).group(1))  # type: ignore[union-attr]
    return subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=20).returncode


def entrypoint() -> list[str]:
    """ENTRYPOINT with its command resolved to the console script installed beside this interpreter
    (the image puts it on PATH)."""
    command = json.loads(re.search(r"^ENTRYPOINT (.+)$", DOCKERFILE, flags=re.M).group(1))  # type: ignore[union-attr]
    executable = shutil.which(command[0], path=str(Path(sys.executable).parent)) or shutil.which(command[0])
    if executable is None:
        pytest.skip(f"the {command[0]} command is not installed (pip install -e .)")
    return [executable, *command[1:]]


def default_command() -> list[str]:
    """CMD, its paths inside the image (under WORKDIR, where the Dockerfile copies the repo's files) made
    this checkout's."""
    workdir = re.search(r"^WORKDIR (.+)$", DOCKERFILE, flags=re.M).group(1).rstrip("/") + "/"  # type: ignore[union-attr]
    command = json.loads(re.search(r"^CMD (.+)$", DOCKERFILE, flags=re.M).group(1))  # type: ignore[union-attr]
    return [str(ROOT / arg.removeprefix(workdir)) if arg.startswith(workdir) else arg for arg in command]


async def listening(container: Process) -> dict[str, object]:
    for _ in range(600):
        if '"event":"listening"' in container.output:
            return next(json.loads(line) for line in container.output.splitlines() if '"listening"' in line)
        assert container.popen is not None and container.popen.poll() is None, container.output
        await asyncio.sleep(0.1)
    raise AssertionError(f"not listening within 60 s:\n{container.output[-2000:]}")


def docker_run_env(**env: str) -> dict[str, str]:
    """The image's environment, `-e` options over it; none of the test runner's keys."""
    inherited = {k: v for k, v in os.environ.items() if k not in ("CONTEXT_GUARD_KEY", "OPENAI_API_KEY")}
    return {**inherited, **dockerfile_env(), "PORT": str(free_port()), **env}


class TestDefaultCommand:
    def test_without_context_guard_key_it_refuses_to_start_in_one_line_naming_it(self, tmp_path):
        env = docker_run_env(OPENAI_API_KEY="sk-test")
        run = subprocess.run([*entrypoint(), *default_command()], env=env, capture_output=True, timeout=60, cwd=ROOT)
        lines = (run.stdout + run.stderr).decode().strip().splitlines()
        assert run.returncode == 2 and len(lines) == 1 and "CONTEXT_GUARD_KEY" in lines[0], lines

    async def test_with_context_guard_key_it_serves_every_interface_and_refuses_clients_without_it(
        self, tmp_path, processes
    ):
        env = docker_run_env(OPENAI_API_KEY="sk-test", CONTEXT_GUARD_KEY="cg-test")
        container = Process("container", [*entrypoint(), *default_command()], tmp_path / "c.log", env)
        processes.append(container.start())
        event = await listening(container)
        assert event["host"] == "0.0.0.0" and event["port"] == int(env["PORT"])
        url = f"http://127.0.0.1:{env['PORT']}/v1/chat/completions"
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        async with aiohttp.ClientSession() as session, session.post(url, json=body) as r:
            assert r.status == 401 and (await r.json())["error"]["type"] == "invalid_request_error"
        assert health_check(env) == 0


async def test_docker_run_with_an_upstream_listens_on_every_interface_and_is_healthy(
    tmp_path, start_upstream, processes
):
    upstream = await start_upstream()
    env = docker_run_env()  # as `docker run -e PORT=...`
    container = Process("container", [*entrypoint(), "--upstream", upstream.url], tmp_path / "c.log", env)
    processes.append(container.start())
    listening_event = await listening(container)
    assert listening_event["host"] == "0.0.0.0" and listening_event["port"] == int(env["PORT"])
    assert health_check(env) == 0
    container.signal(signal.SIGTERM)
    assert await container.exited(30) == 0
    assert health_check(env) != 0
