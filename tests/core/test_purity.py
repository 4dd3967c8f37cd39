"""The core is pure: importing it loads no server, network or config code."""

from __future__ import annotations

import subprocess
import sys


def test_importing_the_core_does_not_load_aiohttp_litellm_or_yaml():
    code = (
        "import sys, proxy.core.plan, proxy.core.trimming.strategies, proxy.core.counting.request_count;"
        "bad = [m for m in ('aiohttp', 'litellm', 'yaml', 'structlog', 'proxy.server', 'tiktoken') if m in sys.modules];"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
