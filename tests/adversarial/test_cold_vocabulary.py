"""A client cannot make the guard build a vocabulary its upstreams serve while it serves others:
building one holds the GIL, and with it the event loop, for 0.1-0.5 s (docs/security.md, "What
runs off the event loop"). A real `context-guard serve` in front of a generic upstream loads
OpenAI's encodings (and cl100k_base, the bound's base for Claude and every unknown name) before
`/readyz` answers 200, so the first request naming gpt-4o, gpt-4 or Claude adds no vocabulary's
memory (o200k_base alone is 41-47 MB resident); a family it did not load (Llama 3) still does,
once, which is what `tokenizers.preload: all` is for. Memory is read from /proc: no clock."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests.support.processes import Guard, guard_before_fake_upstream

pytestmark = [
    pytest.mark.components,  # a guard process of its own
    pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="resident memory is read from Linux's /proc"),
]

A_VOCABULARY_MB = 20  # the smallest tiktoken-format vocabulary measured adds 23 MB (cl100k_base)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise KeyError("VmRSS")


async def first_request_growth(guard: Guard, model: str) -> float:
    """How much the guard's resident memory grew over the first request naming `model`."""
    before = rss_mb(guard.pid)
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}]}
    async with aiohttp.ClientSession() as session, session.post(guard.url("/v1/chat/completions"), json=body) as r:
        assert r.status == 200
    return rss_mb(guard.pid) - before


@pytest.fixture
async def guard(tmp_path: Path) -> AsyncIterator[Guard]:
    async with guard_before_fake_upstream(tmp_path, warm=False) as process:
        yield process


class TestFirstRequestOfAModel:
    @pytest.mark.parametrize("model", ["gpt-4o", "gpt-4-0613", "claude-3-5-sonnet-20241022"])
    async def test_a_model_the_upstream_serves_finds_its_vocabulary_loaded_at_start(self, guard, model):
        grown = await first_request_growth(guard, model)
        assert grown < A_VOCABULARY_MB, f"the first {model} request grew the guard by {grown:.0f} MB"

    async def test_a_family_not_loaded_at_start_is_loaded_by_its_first_request(self, guard):
        """The control: what the test above would see had the vocabulary not been loaded at start."""
        assert await first_request_growth(guard, "llama-3.1-8b-instruct") >= A_VOCABULARY_MB
