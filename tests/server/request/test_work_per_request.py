"""The work the guard does per warm request, counted, not timed: a change that adds per-request
work fails here, on any machine, however loaded (wall-clock figures stay in `bench/`).

The real app runs in-process in front of an in-process upstream that reads the body and answers
a fixed completion (bench/servers.py's). A warm 88 KB agent conversation (bench/conversations.py)
is sent once, then `REQUESTS` times more, in two scenarios: the same body re-sent (a retry, a
regenerated answer) and the body re-sent with a new turn (the usual next request). While those
run, a `sys.setprofile` hook counts, per request:

- `python_calls`: starts of functions whose code lives in `proxy/`, and of library functions
  that code calls directly (`fnmatch`, `secrets`, tiktoken's wrapper); a coroutine or generator
  resumed after an `await` or `yield` is not a new start, so how often the event loop switched
  does not change it;
- `c_calls`: calls of built-in (C) functions made from that code: orjson, tiktoken's encoder,
  bytes and dict methods, `len`;
- `encodes`: calls of the tokenizer's encoders among those (the counting layer's real work).

The figures are measured in a fresh interpreter (`python tests/server/request/test_work_per_request.py --json`),
so that nothing earlier tests left behind moves them. The hook only sees this thread; a warm body is small in new bytes, so nothing goes to the
large-body threads. The collector is off while requests are counted (its callbacks would count
too), and each scenario is warmed before it is counted, so the same code path runs every time:
the function starts and encodes are the same from run to run (three runs gave identical counts
when they were pinned), the C calls within a fifth of a call per request.

Re-pinning: when a change lowers the work, or must add some, run
`PYTHONPATH=. python tests/server/request/test_work_per_request.py` (it prints each figure and, with `--by-function`,
the functions with the most starts per request), and set `PINNED` to the new figures in the same
commit, saying why in its message. A figure may rise to `MARGIN` above its pin before the test fails.
"""

from __future__ import annotations

import asyncio
import dis
import gc
import io
import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestServer

from bench.conversations import agent_conversation
from bench.servers import upstream_app
from proxy.logging import configure_logging
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.server.conftest import gateway_settings

ROOT = Path(__file__).parents[3]
PROXY = str(ROOT / "proxy") + os.sep
REQUESTS = 12
MARGIN = 0.10
MODEL = "gpt-4.1"  # o200k_base, a 1M-token window: the body fits and is forwarded as received

# Per warm request, measured at `REQUESTS` requests of each scenario (see the docstring to re-pin):
# the guard's Python calls, C calls and encoder calls. A body sent again takes the plan kept for the
# same bytes and encodes nothing; a new turn encodes its new message and the reply's priming. The
# figures are pinned so that work added to every request fails here, naming the scenario; what moved
# them, change by change, is in bench/changes.md and the commit log. The C calls move by a fifth of
# a call per request from run to run (a timer-driven call now and then): pinned at the figure
# rounded up.
PINNED: dict[str, dict[str, float]] = {
    "same body": {"python_calls": 301, "c_calls": 162, "encodes": 0},
    "new turn": {"python_calls": 448, "c_calls": 511, "encodes": 2},
}
ENCODERS = frozenset({"encode", "encode_ordinary", "encode_batch", "encode_ordinary_batch", "_encode_native"})


def conversation() -> dict[str, Any]:
    """About 88 KB: a system prompt and agent turns (questions, tool calls, JSON results, answers)."""
    body = agent_conversation(int(88_000 / 3.7))
    body["model"] = MODEL
    return body


def with_new_turn(body: dict[str, Any], i: int) -> bytes:
    """The conversation and one new exchange of the same length for every `i`."""
    turn = [
        {"role": "assistant", "content": f"Answer {i:05d}: nothing material changed; the totals hold."},
        {"role": "user", "content": f"Follow-up {i:05d}: what changed since the last answer?"},
    ]
    return orjson.dumps({**body, "messages": [*body["messages"], *turn]})


@dataclass
class WorkCounter:
    """A `sys.setprofile` hook counting function starts in `proxy/` and C calls made from there."""

    starts: Counter[str] = field(default_factory=Counter)
    c_calls: int = 0
    c_calls_by_caller: Counter[str] = field(default_factory=Counter)
    encodes: int = 0
    _first_resume: dict[CodeType, int] = field(default_factory=dict)

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        code = frame.f_code
        if not code.co_filename.startswith(PROXY):
            caller = frame.f_back
            called_by_guard = caller is not None and caller.f_code.co_filename.startswith(PROXY)
            if event == "call" and called_by_guard and frame.f_lasti <= self._start_of(code):
                self.starts[f"{code.co_filename.rsplit(os.sep, 1)[-1]}:{code.co_qualname}"] += 1
                if code.co_name in ENCODERS:  # tiktoken's Python wrapper
                    self.encodes += 1
            return
        if event == "call":
            if frame.f_lasti <= self._start_of(code):  # not a coroutine or generator resumed
                self.starts[code.co_qualname] += 1
        elif event == "c_call":
            self.c_calls += 1
            self.c_calls_by_caller[f"{code.co_qualname} -> {getattr(arg, '__qualname__', arg)}"] += 1
            if getattr(arg, "__name__", "") in ENCODERS:
                self.encodes += 1

    def _start_of(self, code: CodeType) -> int:
        """The offset of the code's first RESUME: where a call starts (later ones follow a yield)."""
        offset = self._first_resume.get(code)
        if offset is None:
            offset = next((i.offset for i in dis.get_instructions(code) if i.opname == "RESUME"), 0)
            self._first_resume[code] = offset
        return offset


async def measure(aiohttp_server: Callable[..., Any], model_map: Any, requests: int = REQUESTS) -> dict[str, Any]:
    """The work per request of each scenario, and the counter of each (for `--by-function`)."""
    configure_logging("json", "info", stream=io.StringIO())  # a line per request, rendered as in production
    upstream = await aiohttp_server(upstream_app())
    settings = gateway_settings(str(upstream.make_url("/v1")))
    proxy: TestServer = await aiohttp_server(create_app(settings, Models(settings, model_map)))
    url = str(proxy.make_url("/v1/chat/completions"))
    body = conversation()
    base = orjson.dumps(body)
    scenarios: dict[str, Callable[[int], bytes]] = {
        "same body": lambda i: base,
        "new turn": lambda i: with_new_turn(body, i),
    }
    figures: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:

        async def post(raw: bytes) -> None:
            async with session.post(url, data=raw, headers={"Content-Type": "application/json"}) as answer:
                await answer.read()
                assert answer.status == 200, answer.status

        for name, make in scenarios.items():
            for i in range(3):  # the conversation seen, its caches warm, the path taken once before
                await post(base)
                await post(make(10_000 + i))
            await post(base)
            raws = [make(i) for i in range(requests)]
            counter = WorkCounter()
            gc.collect()
            gc.disable()
            try:
                for raw in raws:
                    sys.setprofile(counter)
                    try:
                        await post(raw)
                    finally:
                        sys.setprofile(None)
                    if name == "new turn":  # the next new turn extends the conversation as the first did
                        await post(base)
            finally:
                gc.enable()
            figures[name] = {
                "python_calls": counter.starts.total() / requests,
                "c_calls": counter.c_calls / requests,
                "encodes": counter.encodes / requests,
                "counter": counter,
            }
    return figures


def measured(model_map: Any) -> dict[str, Any]:
    """`measure` in a loop of its own, its servers on port 0 of 127.0.0.1, closed after."""

    async def run() -> dict[str, Any]:
        servers: list[TestServer] = []

        async def start(app: Any) -> TestServer:
            server = TestServer(app, host="127.0.0.1")
            await server.start_server()
            servers.append(server)
            return server

        try:
            return await measure(start, model_map)
        finally:
            for server in reversed(servers):
                await server.close()

    return asyncio.run(run())


@pytest.fixture(scope="module")
def figures() -> dict[str, Any]:
    """Measured once for the module's tests, in a fresh interpreter: in the suite's own process,
    what earlier tests left behind (loggers cached on their first use under another logging
    configuration, module-level caches) put the C calls of a body sent again at 259, not 231."""
    out = subprocess.run(
        [sys.executable, str(Path(__file__)), "--json"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


class TestWorkPerWarmRequest:
    @pytest.mark.parametrize("scenario", list(PINNED))
    @pytest.mark.parametrize("measure_name", ["python_calls", "c_calls", "encodes"])
    def test_is_at_most_its_pinned_figure(self, figures: dict[str, Any], scenario: str, measure_name: str):
        measured, pinned = figures[scenario][measure_name], PINNED[scenario][measure_name]
        print(f"{scenario}: {measure_name} {measured:.1f} per request (pinned {pinned})")
        where = figures[scenario]["starts" if measure_name == "python_calls" else "c_calls_by_caller"]
        most = ", ".join(f"{name} {count / REQUESTS:.1f}" for name, count in where)
        assert measured <= pinned * (1 + MARGIN), (
            f"{scenario}: {measured:.1f} {measure_name} per request, pinned at {pinned} (+{MARGIN:.0%}): "
            f"a change added per-request work; see this module's docstring to re-pin if it must. Most: {most}"
        )

    def test_a_body_sent_again_costs_less_than_one_with_a_new_turn(self, figures: dict[str, Any]):
        assert figures["same body"]["python_calls"] < figures["new turn"]["python_calls"]


def main() -> None:
    """Print each figure (and, with --by-function, where the starts are) for re-pinning."""
    from proxy.tokenizers.model_map import load_model_map

    figures = measured(load_model_map())
    if "--json" in sys.argv:  # for the test: the figures, and where the most work is
        print(
            json.dumps(
                {
                    name: {
                        **{k: v for k, v in got.items() if k != "counter"},
                        "starts": got["counter"].starts.most_common(30),
                        "c_calls_by_caller": got["counter"].c_calls_by_caller.most_common(30),
                    }
                    for name, got in figures.items()
                }
            )
        )
        return
    for name, got in figures.items():
        print(f"{name}: " + ", ".join(f"{k} {v:.1f}" for k, v in got.items() if k != "counter"))
        if "--by-function" in sys.argv:
            for qualname, count in got["counter"].starts.most_common(40):
                print(f"    {count / REQUESTS:7.1f}  {qualname}")
            for qualname, count in got["counter"].c_calls_by_caller.most_common(40):
                print(f"    {count / REQUESTS:7.1f}  C: {qualname}")


if __name__ == "__main__":
    main()
