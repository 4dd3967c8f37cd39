"""Stopping a server process that the benchmarks or the tests started: SIGTERM, a bounded wait for
it to drain and exit, then SIGKILL. Never left running, never waited on forever."""

from __future__ import annotations

import subprocess


def stop(process: subprocess.Popen[bytes], timeout: float = 15.0) -> int:
    """Stop `process` (already stopped: nothing to do); its exit status."""
    if process.poll() is not None:
        return process.returncode
    process.terminate()
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(timeout=timeout)
