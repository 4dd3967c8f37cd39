"""The Docker image, built from the Dockerfile and run by a real Docker engine (`make test-image`).

scripts/install-docker.sh makes the engine and a base image ready and names the base in
$CONTEXT_GUARD_BASE (python:3.11-slim, or a debootstrap stand-in where Docker Hub is out of reach).
The image is built once for the module; every container runs on the host's network (the engine runs
with no bridge) on a port the test chose, or with no network at all, and is removed at the end.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI

from tests.support.processes import free_port

pytestmark = pytest.mark.image

ROOT = Path(__file__).parent.parent.parent
BUILD_SECONDS = 1800  # a cold build on two cores with the vfs storage driver takes 5-10 minutes


def docker(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="module")
def image() -> Iterator[str]:
    base = os.environ.get("CONTEXT_GUARD_BASE", "python:3.11-slim")
    tag = f"context-guard:test-{uuid.uuid4().hex[:8]}"
    built = docker(
        "build", "--network", "host", "--build-arg", f"BASE={base}", "-t", tag, str(ROOT),
        timeout=BUILD_SECONDS, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    yield tag
    docker("rmi", "-f", tag, check=False)


class Container:
    """One detached container; `remove()` always leaves none behind."""

    def __init__(self, image: str, *args: str, network: str = "host", env: dict[str, str] | None = None) -> None:
        self.name = f"cg-test-{uuid.uuid4().hex[:10]}"
        flags = [flag for key, value in (env or {}).items() for flag in ("-e", f"{key}={value}")]
        docker("run", "-d", "--name", self.name, "--network", network, *flags, image, *args)

    def inspect(self, template: str) -> str:
        return docker("inspect", "--format", template, self.name).stdout.strip()

    def logs(self) -> str:
        out = docker("logs", self.name, check=False)
        return out.stdout + out.stderr

    def exec(self, *command: str) -> subprocess.CompletedProcess[str]:
        return docker("exec", self.name, *command, check=False)

    def remove(self) -> None:
        docker("rm", "-f", self.name, check=False)


@pytest.fixture
def containers() -> Iterator[list[Container]]:
    started: list[Container] = []
    yield started
    for container in started:
        container.remove()


def wait_until_live(port: int, container: Container, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        if container.inspect("{{.State.Running}}") != "true":
            break
        time.sleep(0.3)
    pytest.fail(f"the container did not answer /livez on {port}:\n{container.logs()[-3000:]}")


def serving_echo(image: str, containers: list[Container]) -> tuple[Container, int]:
    port = free_port()
    container = Container(image, "--upstream", "echo", env={"PORT": str(port)})
    containers.append(container)
    wait_until_live(port, container)
    return container, port


class TestTheImagesDefaultConfig:
    def test_without_a_client_key_the_container_refuses_to_start_and_names_the_variable(self, image):
        run = docker("run", "--rm", "--network", "none", image, check=False, timeout=120)
        assert run.returncode != 0
        assert "CONTEXT_GUARD_KEY is not set" in run.stdout + run.stderr

    def test_with_a_client_key_it_serves_and_refuses_a_client_without_that_key(self, image, containers):
        port = free_port()
        env = {"PORT": str(port), "CONTEXT_GUARD_KEY": "cg-team-key", "OPENAI_API_KEY": "sk-never-used"}
        container = Container(image, env=env)
        containers.append(container)
        wait_until_live(port, container)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="not-the-key", max_retries=0, timeout=30)
        with pytest.raises(Exception) as refused:
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        assert getattr(refused.value, "status_code", None) == 401


class TestTheImageServing:
    def test_it_counts_and_forwards_a_chat_request_sent_by_the_openai_sdk(self, image, containers):
        _, port = serving_echo(image, containers)
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=30)
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hello from the image"}]
        )
        completion = raw.parse()
        assert raw.http_response.status_code == 200
        assert raw.headers["x-context-guard-tokens-after"] == str(completion.usage.prompt_tokens)

    def test_it_counts_with_no_network_at_all_because_its_vocabularies_are_baked_in(self, image, containers):
        container = Container(image, "--upstream", "echo", network="none", env={"PORT": "8080"})
        containers.append(container)
        request = (
            "import json, time, urllib.request as u\n"
            "body = json.dumps({'model': 'gpt-4o', 'messages': [{'role': 'user', 'content': 'hello'}]}).encode()\n"
            "for _ in range(120):\n"
            "    try:\n"
            "        r = u.urlopen(u.Request('http://127.0.0.1:8080/v1/chat/completions', body,"
            " {'Content-Type': 'application/json'}), timeout=5)\n"
            "        print(json.dumps({'status': r.status, 'tokens': r.headers['x-context-guard-tokens-after']}))\n"
            "        break\n"
            "    except OSError:\n"
            "        time.sleep(0.5)\n"
        )
        answered = container.exec("python", "-c", request)
        assert answered.returncode == 0, answered.stderr + container.logs()[-2000:]
        assert json.loads(answered.stdout) == {"status": 200, "tokens": "8"}

    def test_it_runs_as_an_unprivileged_user(self, image, containers):
        container, _ = serving_echo(image, containers)
        assert container.exec("id", "-u").stdout.strip() == "10001"

    def test_its_healthcheck_reports_the_container_healthy(self, image, containers):
        container, _ = serving_echo(image, containers)
        deadline = time.monotonic() + 90  # the HEALTHCHECK runs every 15 s
        while container.inspect("{{.State.Health.Status}}") != "healthy" and time.monotonic() < deadline:
            time.sleep(1)
        assert container.inspect("{{.State.Health.Status}}") == "healthy", container.logs()[-2000:]

    def test_docker_stop_drains_it_and_it_exits_zero(self, image, containers):
        container, _ = serving_echo(image, containers)
        docker("stop", "--time", "60", container.name, timeout=90)
        assert container.inspect("{{.State.ExitCode}}") == "0"
        events = [json.loads(line).get("event") for line in container.logs().splitlines() if line.startswith("{")]
        assert "draining" in events and "stopped" in events
