"""The guard's counts against a real llama.cpp server, per kind of content, for each way of counting.

Starts llama-cpp-python's server with SmolLM2-135M-Instruct and a 2,048-token window (installed by
scripts/install-llama.sh), and for each kind of content compares the guard's count of a request
with the server's `usage.prompt_tokens`:

    estimate     what an unknown model gets: cl100k_base x1.6 and a template upper bound
    calibrated   the same estimate, scaled by what calibration learned from 3 earlier requests
    gguf         `huggingface:<the server's .gguf>`: the real vocabulary, the template's framing guessed
    backend      the server's own tokenizer, the template framing measured (proxy.server.backends.tokenize)

Then it sends over-window conversations trimmed by each and reports the share of the window the
request really used, and how many the server refused. `--write` puts the result in
docs/benchmarks.md. Run with `make bench-real`.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.config.settings import Settings
from proxy.core.counting.count_cache import CountCache
from proxy.core.counting.request_count import RequestCounter
from proxy.core.counting.tokenizer import PrefetchedTokenizer, Tokenizer
from proxy.core.exchange import BACKEND_ROUNDS
from proxy.core.learning.calibration import Calibration, CalibrationPolicy, calibrated
from proxy.core.models.model_registry import ModelProfile, TokenizerSpec
from proxy.core.plan import Plan
from proxy.server.backends.models import Models
from proxy.server.backends.tokenize import BackendCounter
from proxy.server.backends.tokenize_calls import LlamaCppPythonCalls
from proxy.server.upstream.usage import usage_from_body
from tests.real.corpus import body
from tests.real.llama import MODEL, LlamaServer, running_server
from tests.support.guard import plan_with

METHODS = ("estimate", "calibrated", "gguf", "backend")
# The kinds of content measured (the large-system-prompt conversations are English: nothing new to count).
BENCH_KINDS = ("english", "code", "cjk", "json", "tools")
DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
SECTION = "## bench/real_backend.py"


async def server_count(session: aiohttp.ClientSession, llama: LlamaServer, request: Mapping[str, Any]) -> int | None:
    """The server's `usage.prompt_tokens` for `request`, or None when it refused it."""
    async with session.post(f"{llama.url}/chat/completions", json={**request, "max_tokens": 1}) as response:
        raw = await response.read()
        if response.status != 200:
            return None
    usage = usage_from_body(raw)
    return usage.prompt_tokens if usage else None


class Methods:
    """The four ways of counting, each a (profile, tokenizer) for a request."""

    def __init__(self, guard: Models, llama: LlamaServer, session: aiohttp.ClientSession) -> None:
        self.guard = guard
        self.profile = guard.profile(MODEL)
        self.estimate = guard.tokenizer(self.profile)
        self.gguf = guard.tokenizers.get(TokenizerSpec("huggingface", str(llama.gguf)))
        self.backend = BackendCounter("llama", LlamaCppPythonCalls(session, llama.url, MODEL), CountCache())
        self.calibration = Calibration()

    async def counting(self, method: str, request: dict[str, Any]) -> tuple[ModelProfile, Tokenizer]:
        if method == "estimate":
            return self.profile, self.estimate
        if method == "calibrated":
            return self.profile, calibrated(self.estimate, self.calibration)
        if method == "gguf":
            return self.profile, self.gguf
        prepared = await self.backend.prepare(request, self.profile, self.estimate)
        return prepared.profile, prepared.tokenizer

    async def plan(self, method: str, request: dict[str, Any], window: int) -> Plan:
        """`request` trimmed to `window`, counted by `method`. With the backend's tokenizer, the
        texts the trim produced are fetched from the backend and the plan re-made with them (a
        few rounds); what it sends is measured by the server's own count either way."""
        profile, tokenizer = await self.counting(method, request)
        plan = plan_with(self.guard, request, MODEL, window, counting=(profile, tokenizer))
        for _ in range(BACKEND_ROUNDS):
            if not isinstance(tokenizer, PrefetchedTokenizer) or not tokenizer.missing:
                break
            await self.backend.complete(tokenizer)
            plan = plan_with(self.guard, request, MODEL, window, counting=(profile, tokenizer))
        return plan

    async def count(self, method: str, request: dict[str, Any]) -> int:
        profile, tokenizer = await self.counting(method, request)
        return RequestCounter(profile, tokenizer).request(request).total

    def learn(self, request: dict[str, Any], server: int) -> None:
        raw = RequestCounter(self.profile, self.estimate).request(request).total
        self.calibration = self.calibration.observe(server, raw, CalibrationPolicy())


async def ratios_by_kind(llama: LlamaServer, guard: Models) -> dict[str, dict[str, float]]:
    """Guard count / server count, per kind and method: the mean over two requests of that kind
    that fit the window (sizes 1 and 2: ~450 to ~1,900 tokens), calibration learned from three
    earlier requests of the same kind."""
    table: dict[str, dict[str, float]] = {}
    async with aiohttp.ClientSession() as session:
        for kind in BENCH_KINDS:
            methods = Methods(guard, llama, session)
            for size in (1, 2, 1):  # calibration's warm-up, on other requests of this kind
                request = body(kind, size, MODEL)
                server = await server_count(session, llama, request)
                if server is not None:
                    methods.learn(request, server)
            ratios: dict[str, list[float]] = {m: [] for m in METHODS}
            for size in (2, 1):
                request = body(kind, size, MODEL)
                request["messages"][-1]["content"] += " (measured)"
                server = await server_count(session, llama, request)
                if server is None:
                    continue
                for method in METHODS:
                    ratios[method].append(await methods.count(method, request) / server)
            table[kind] = {m: statistics.mean(r) for m, r in ratios.items() if r}
    return table


async def window_use(llama: LlamaServer, guard: Models) -> tuple[dict[str, tuple[float, int, int]], tuple[int, int]]:
    """Per method: the mean share of the window the server counted in what the guard sent, how
    many it refused, and how many were sent; over-window conversations trimmed to fit 2,048.
    Also the smallest and largest of those conversations, as the backend counts them."""
    result: dict[str, tuple[float, int, int]] = {}
    sizes: list[int] = []
    async with aiohttp.ClientSession() as session:
        methods = Methods(guard, llama, session)
        for size in (1,):  # calibration learns from a few ordinary requests first
            for kind in BENCH_KINDS:
                request = body(kind, size, MODEL)
                server = await server_count(session, llama, request)
                if server is not None:
                    methods.learn(request, server)
        for method in METHODS:
            shares: list[float] = []
            refused = sent = 0
            for kind in BENCH_KINDS:
                request = body(kind, 10, MODEL)
                if method == "backend":
                    sizes.append(await methods.count(method, request))
                plan = await methods.plan(method, request, llama.n_ctx)
                if plan.result.outcome == "rejected":
                    continue
                sent += 1
                server = await server_count(session, llama, plan.result.body)
                if server is None:
                    refused += 1
                else:
                    shares.append(server / llama.n_ctx)
            result[method] = (statistics.mean(shares) if shares else 0.0, refused, sent)
    return result, (min(sizes), max(sizes))


def render(
    ratios: dict[str, dict[str, float]],
    use: dict[str, tuple[float, int, int]],
    sizes: tuple[int, int],
    llama: LlamaServer,
) -> str:
    lines = [
        SECTION,
        "",
        f"SmolLM2-135M-Instruct on llama-cpp-python's server, `--n_ctx {llama.n_ctx}`, model name unknown to the "
        "guard. Guard count / server `usage.prompt_tokens` (1.00 is exact; below 1 the guard undercounts and "
        "the server may refuse the request). Rerun with `make bench-real`.",
        "",
        "| content | " + " | ".join(METHODS) + " |",
        "|---|" + "---:|" * len(METHODS),
    ]
    for kind, row in ratios.items():
        lines.append(f"| {kind} | " + " | ".join(f"{row.get(m, float('nan')):.3f}" for m in METHODS) + " |")
    lines += [
        "",
        f"Over-window conversations ({len(BENCH_KINDS)} kinds, {sizes[0]:,} to {sizes[1]:,} tokens) trimmed to the "
        "same window by each way of counting (`estimate` and `calibrated` as the guard's defaults would, before any "
        "self-correction); "
        "the share of the window the server counted in what was sent, and how many it refused:",
        "",
        "| counting | window used | refused |",
        "|---|---:|---:|",
    ]
    for method, (share, refused, sent) in use.items():
        lines.append(f"| {method} | {share:.0%} | {refused} of {sent} |")
    return "\n".join(lines) + "\n"


def write_section(text: str, doc: Path = DOC) -> None:
    content = doc.read_text(encoding="utf-8")
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(content):
        content = pattern.sub(lambda _: text + "\n", content)
    elif "\n## Notes" in content:
        content = content.replace("\n## Notes", "\n" + text + "\n## Notes", 1)
    else:
        content = content.rstrip("\n") + "\n\n" + text
    doc.write_text(content, encoding="utf-8")


def main(argv: list[str] | None = None, run: Callable[..., Any] = asyncio.run) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--write", action="store_true", help=f"replace the section in {DOC.name}")
    args = parser.parse_args(argv)
    guard = Models(Settings())
    with tempfile.TemporaryDirectory() as folder, running_server(Path(folder) / "server.log") as llama:
        ratios = run(ratios_by_kind(llama, guard))
        use, sizes = run(window_use(llama, guard))
    text = render(ratios, use, sizes, llama)
    print(text)
    if args.write:
        write_section(text)


if __name__ == "__main__":
    main()
