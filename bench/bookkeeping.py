"""The CPU of a request's bookkeeping when it ends, in-process, for one or more checkouts.

A warm 88 KB request goes through the real app (the fake upstream and the guard in this process,
on 127.0.0.1 ports of their own); its `RequestRecord` is kept and what the `records` middleware
does with it is timed piece by piece: the metrics, the log event, the JSON line written (to
/dev/null), the page's row, and `_write`, all of them. CPU time of this process, the least of 7
repetitions of 20,000 calls; each checkout runs in its own process, the checkouts interleaved
round by round (`bench/warm_core.py` does the same for parse and plan).

Run: python bench/bookkeeping.py --guard before=/tmp/base --guard after=. [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from bench.warm_core import least_per_tree  # noqa: E402

CALLS, REPEATS = 20_000, 7


async def measure() -> dict[str, float]:
    """In a process whose `proxy` is the checkout's: each piece, in microseconds per request."""
    import aiohttp
    from aiohttp.test_utils import TestServer

    from bench.load import MODEL, Bodies
    from bench.servers import upstream_app
    from proxy.config.settings import load_settings
    from proxy.logging import configure_logging, log_request_line
    from proxy.server.observation.recent import RecentDecisions
    from proxy.server.observation.record import RequestRecord, log_event
    from proxy.server.process import app as app_module

    records: list[RequestRecord] = []
    add = RecentDecisions.add

    def keep(self: RecentDecisions, record: RequestRecord) -> None:
        records.append(record)
        add(self, record)

    RecentDecisions.add = keep  # type: ignore[method-assign]  # to capture the record the app wrote
    upstream = TestServer(upstream_app())
    await upstream.start_server()
    with tempfile.TemporaryDirectory() as folder, open(os.devnull, "w") as sink:
        config = Path(folder) / "context-guard.yaml"
        config.write_text(
            f"log:\n  format: json\nupstreams:\n  fake:\n    base_url: http://127.0.0.1:{upstream.port}/v1\n"
            f"routes:\n  - match: {MODEL}\n    upstream: fake\n"
        )
        configure_logging("json", "info", sink)
        app = app_module.create_app(load_settings(str(config)))
        guard = TestServer(app)
        await guard.start_server()
        bodies = Bodies.of_size(88_000)
        async with aiohttp.ClientSession() as session:
            for body in [bodies.base, *(bodies.warm() for _ in range(5))]:
                url = f"http://127.0.0.1:{guard.port}/v1/chat/completions"
                async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as answer:
                    await answer.read()
        await guard.close()
        await upstream.close()
        RecentDecisions.add = add  # type: ignore[method-assign]
        record, gateway, recent = records[-1], app[app_module.GATEWAY], RecentDecisions(500)
        event = log_event(record, gateway.settings.log.max_line_bytes)
        pieces: dict[str, Any] = {
            "metrics": lambda: gateway.metrics.observe(record),
            "log_event": lambda: log_event(record, gateway.settings.log.max_line_bytes),
            "log_line": lambda: log_request_line(gateway.log, False, "request", event),
            "page_row": lambda: recent.add(record),
            "write_all": lambda: app_module._write(gateway, record, recent),
        }
        return {
            name: min(timeit.repeat(piece, number=CALLS, repeat=REPEATS, timer=time.process_time)) / CALLS * 1e6
            for name, piece in pieces.items()
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--guard", action="append", default=[], help="NAME=SOURCE_TREE (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # measure in this process
    args = parser.parse_args()
    if args.measure:
        sys.path[:0] = [os.getcwd(), str(ROOT)]  # the checkout's proxy; bench.load from here if it has none
        print(json.dumps(asyncio.run(measure())))
        return
    best = least_per_tree(Path(__file__), args.guard, args.rounds, ["--measure"])
    for name, figures in best.items():
        print(f"{name:12s} " + "  ".join(f"{key} {value:6.1f} us" for key, value in figures.items()))


if __name__ == "__main__":
    main()
