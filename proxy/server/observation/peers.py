"""Every worker's recent decisions, for the page whichever worker serves it.

With `--workers N` the kernel hands each connection to any worker, and each keeps its own ring of
decisions (`proxy.server.observation.recent`): a page made from one ring would show a different share of the
traffic on each reload. So the supervisor makes a private directory (mode 0700, removed when it
stops), and each worker answers its ring's JSON on a Unix socket there (`worker-<n>.sock`, one
path, `GET /decisions`, nothing else). The worker that serves the page asks all the others at once,
within `ASK_TIMEOUT_SECONDS`, and shows every row, newest first, each with the worker that decided
it, saying which workers did not answer. Nothing is done per request: the work is the page's.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from proxy.server.observation.page import json_text_sliced
from proxy.server.observation.recent import Decision, PageQuery, RecentDecisions

ASK_TIMEOUT_SECONDS = 2.0
DECISIONS_PATH = "/decisions"


@dataclass(frozen=True, slots=True)
class Peers:
    """Worker `worker` of `count`, whose sockets are in `directory`."""

    directory: str
    worker: int
    count: int

    def socket(self, worker: int) -> str:
        return os.path.join(self.directory, f"worker-{worker}.sock")

    async def gather(self, own: RecentDecisions) -> RecentDecisions:
        """`everyones`: what the page shows (the app's `GATHER`)."""
        return await everyones(self, own)


async def serve_own(recent: RecentDecisions, peers: Peers) -> web.AppRunner:
    """Answer this worker's decisions on its socket, until the returned runner is cleaned up."""

    async def decisions(request: web.Request) -> web.Response:
        text = await json_text_sliced(recent.snapshot(), PageQuery())
        return web.Response(text=text, content_type="application/json")

    app = web.Application()
    app.router.add_get(DECISIONS_PATH, decisions)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    path = peers.socket(peers.worker)
    with contextlib.suppress(FileNotFoundError):  # left by the worker this one replaces
        os.unlink(path)
    await web.UnixSite(runner, path).start()
    return runner


async def everyones(peers: Peers, own: RecentDecisions) -> RecentDecisions:
    """`own` (a snapshot of this worker's ring) with the decisions, corrections and calibration of
    every other worker that answered in time."""
    others = [w for w in range(1, peers.count + 1) if w != peers.worker]
    answers = await asyncio.gather(*(_ask(peers.socket(w)) for w in others))
    theirs = {w: answer for w, answer in zip(others, answers, strict=True) if answer is not None}
    decisions = [d.of_worker(peers.worker) for d in own.decisions]
    for worker, answer in theirs.items():
        decisions += [Decision.from_dict(row, worker) for row in answer.get("rows", ())]
    merged = RecentDecisions(own.size * peers.count)
    merged.decisions.extend(sorted(decisions, key=lambda d: d.at))  # oldest first, as a ring keeps them
    _merge_corrections(merged, own.corrections.items(), *(a.get("corrections", ()) for a in theirs.values()))
    for answer in theirs.values():
        merged.calibration.update(answer.get("calibration") or {})
    merged.calibration.update(own.calibration)
    answered = sorted([peers.worker, *theirs])
    merged.workers = {
        "count": peers.count,
        "answered": answered,
        "missing": [w for w in range(1, peers.count + 1) if w not in answered],
        "served_by": peers.worker,
    }
    return merged


async def _ask(path: str) -> dict[str, Any] | None:
    """A worker's answer, or None when it gave none in time (stopping, restarting, busy)."""
    timeout = aiohttp.ClientTimeout(total=ASK_TIMEOUT_SECONDS)
    try:
        async with (
            aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path), timeout=timeout) as session,
            session.get(f"http://worker{DECISIONS_PATH}") as response,
        ):
            answer = await response.json()
    except (OSError, aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def _merge_corrections(merged: RecentDecisions, own: Any, *theirs: Any) -> None:
    """The latest correction per upstream and model, whichever worker saw it."""
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    entries: list[tuple[tuple[str, str], Mapping[str, Any]]] = list(own)
    for rows in theirs:
        for row in rows:
            kept = {k: v for k, v in row.items() if k not in ("upstream", "model")}
            entries.append(((str(row.get("upstream")), str(row.get("model"))), kept))
    for pair, values in entries:
        if pair not in latest or float(values.get("at", 0)) >= float(latest[pair].get("at", 0)):
            latest[pair] = dict(values)
    for pair, values in sorted(latest.items(), key=lambda item: float(item[1].get("at", 0))):
        merged.corrections[pair] = values
