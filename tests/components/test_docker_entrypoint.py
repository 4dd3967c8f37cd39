"""The image's entrypoint, run as `docker run IMAGE --upstream URL` would run it (no Docker needed):
the Dockerfile's ENV, ENTRYPOINT and the arguments that replace CMD; then its HEALTHCHECK."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.processes import Process, free_port

pytestmark = pytest.mark.components

DOCKERFILE = (Path(__file__).parent.parent.parent / "Dockerfile").read_text()


def dockerfile_env() -> dict[str, str]:
    block = re.search(r"^ENV (HOST=.+?)$\n(?!\s)", DOCKERFILE, flags=re.M | re.S)
    assert block is not None
    return dict(pair.split("=", 1) for pair in block.group(1).replace("\\\n", " ").split())


def health_check(env: dict[str, str]) -> int:
    command = json.loads(re.search(r"HEALTHCHECK .*?CMD (\[[^\n]+\])", DOCKERFILE, flags=re.S).group(1))  # type: ignore[union-attr]
    return subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=20).returncode


async def test_docker_run_with_an_upstream_listens_on_every_interface_and_is_healthy(
    tmp_path, start_upstream, processes
):
    entrypoint = json.loads(re.search(r"^ENTRYPOINT (.+)$", DOCKERFILE, flags=re.M).group(1))  # type: ignore[union-attr]
    upstream = await start_upstream()
    env = {**dockerfile_env(), "PORT": str(free_port())}  # as `docker run -e PORT=...`
    # The console script installed beside this interpreter (the image puts it on PATH).
    executable = shutil.which(entrypoint[0], path=str(Path(sys.executable).parent)) or shutil.which(entrypoint[0])
    if executable is None:
        pytest.skip(f"the {entrypoint[0]} command is not installed (pip install -e .)")
    container = Process("container", [executable, *entrypoint[1:], "--upstream", upstream.url], tmp_path / "c.log", env)
    processes.append(container.start())
    guard_log = container.log_path
    for _ in range(600):
        if '"event":"listening"' in guard_log.read_text():
            break
        assert container.popen is not None and container.popen.poll() is None, guard_log.read_text()
        await asyncio.sleep(0.1)
    listening = next(json.loads(line) for line in guard_log.read_text().splitlines() if '"listening"' in line)
    assert listening["host"] == "0.0.0.0" and listening["port"] == int(env["PORT"])
    assert health_check(env) == 0
    container.signal(signal.SIGTERM)
    assert await container.exited(30) == 0
    assert health_check(env) != 0
