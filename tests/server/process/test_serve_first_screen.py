"""What `serve` shows a person: one human line when it listens (to a terminal; a log pipeline gets
JSON alone), how many workers serve, and no warning about an upstream nothing uses."""

from __future__ import annotations

import io
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from proxy.config.settings import Settings
from proxy.server.process.lifecycle import announce
from tests.support.processes import ROOT, Guard

WITHOUT_KEYS = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k not in ("HOST", "PORT")}


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def on_a_terminal(*args: str, until: str, seconds: float = 90) -> str:
    """`serve` with its standard error on a pseudo-terminal: what it wrote there until `until` appeared."""
    leader, follower = os.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "proxy", "serve", *args],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        env={**WITHOUT_KEYS, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
    )
    os.close(follower)
    seen, deadline = b"", time.monotonic() + seconds
    try:
        while until.encode() not in seen and time.monotonic() < deadline and process.poll() is None:
            if select.select([leader], [], [], 0.5)[0]:
                try:
                    seen += os.read(leader, 65536)
                except OSError:  # the terminal closed: the process is gone
                    break
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
        os.close(leader)
    return seen.decode("utf-8", "replace")


class TestServeOnATerminal:
    def test_it_says_where_it_listens_how_many_workers_and_where_to_look(self):
        screen = on_a_terminal("--upstream", "echo", "--port", "0", until="stop: Ctrl-C")
        assert "context-guard listening on http://127.0.0.1:" in screen
        assert "(1 worker), forwarding to the built-in echo upstream (no model is called)" in screen
        assert "/context-guard/recent" in screen and "/readyz" in screen
        assert "upstream_key_missing" not in screen  # the echo replaces the default OpenAI upstream


class TestServeInALogPipeline:
    async def test_its_output_is_json_lines_only_with_no_warning_for_an_unused_upstream(self, tmp_path: Path):
        guard = Guard("echo", 0, tmp_path, "--upstream", "echo", env={k: "" for k in ("OPENAI_API_KEY",)}).start()
        try:
            await guard.until_ready(path="/livez")
            await guard.logged("listening")
        finally:
            guard.stop()
        lines = [line for line in guard.output.splitlines() if line.strip()]
        assert lines and all(line.startswith("{") for line in lines), lines[:3]
        assert not guard.events("upstream_key_missing")

    async def test_without_the_echo_an_upstream_with_no_key_is_warned_about(self, tmp_path: Path):
        guard = Guard("plain", 0, tmp_path, "--workers", "1", env={"OPENAI_API_KEY": ""}).start()
        try:
            warning = await guard.logged("upstream_key_missing")
        finally:
            guard.stop()
        assert (warning["upstream"], warning["variable"]) == ("openai", "OPENAI_API_KEY")


class TestAnnounce:
    def test_a_supervisor_names_its_workers(self):
        screen = Terminal()
        announce(Settings(), 8080, 2, screen)
        assert screen.getvalue().startswith(
            "context-guard listening on http://127.0.0.1:8080 (2 workers), forwarding to openai"
        )

    def test_nothing_is_written_where_no_person_reads(self):
        written = io.StringIO()
        announce(Settings(), 8080, 1, written)
        assert written.getvalue() == ""
