"""The page of recent decisions with several workers: every worker's rows, whichever serves it.

Two guards in this process stand for two workers: each keeps its own ring, answers it on its
socket in a shared private directory (`proxy.server.observation.peers`), and serves the page from its own ring
and the other's. tests/components/test_workers_and_reload.py does the same with `--workers 2`.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from proxy.core.learning.corrections import Correction
from proxy.server.backends.models import Models
from proxy.server.observation.page import JSON_PATH, PAGE_PATH
from proxy.server.observation.peers import Peers, serve_own
from proxy.server.observation.recent import GATHER, RECENT, Decision, PageQuery, RecentDecisions
from proxy.server.observation.record import RequestRecord
from proxy.server.process.app import create_app
from tests.server.conftest import gateway_settings, long_conversation


@pytest.fixture
def sockets() -> Iterator[str]:
    """A private directory as the supervisor makes one (short: a Unix socket's path is limited)."""
    directory = tempfile.mkdtemp(prefix="cg-peers-")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
async def workers(aiohttp_server: Any, model_map: Any, upstream: Any, sockets: str) -> list[Any]:
    """Two workers of two: (server, its socket's runner)."""
    started = []
    for worker in (1, 2):
        settings = gateway_settings(upstream.url)
        app = create_app(settings, Models(settings, model_map))
        peers = Peers(sockets, worker, 2)
        app[GATHER] = peers.gather
        server = await aiohttp_server(app)
        started.append((server, await serve_own(app[RECENT], peers)))
    yield started
    for _, own in started:
        await own.cleanup()


async def send(server: Any, request_id: str, messages: list[dict[str, str]] | None = None) -> None:
    body = {"model": "gpt-4", "messages": messages or [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as session:
        headers = {"x-request-id": request_id}
        async with session.post(server.make_url("/v1/chat/completions"), json=body, headers=headers) as r:
            assert r.status == 200


async def page_json(server: Any) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(server.make_url(JSON_PATH)) as r:
        assert r.status == 200
        return dict(await r.json())


async def page_html(server: Any) -> str:
    async with aiohttp.ClientSession() as session, session.get(server.make_url(PAGE_PATH)) as r:
        assert r.status == 200
        return await r.text()


class TestEveryWorkersDecisions:
    async def test_either_worker_s_page_shows_both_workers_rows_newest_first_each_with_its_worker(self, workers):
        (first, _), (second, _) = workers
        for n in range(3):
            await send(first, f"one-{n}")
        await send(second, "two-0", long_conversation(200))  # trimmed: its removals travel too
        await send(second, "two-1")
        for server in (first, second):
            page = await page_json(server)
            rows = {row["request_id"]: row for row in page["rows"]}
            assert set(rows) == {"one-0", "one-1", "one-2", "two-0", "two-1"}
            assert {rid: row["worker"] for rid, row in rows.items()} == {
                "one-0": 1, "one-1": 1, "one-2": 1, "two-0": 2, "two-1": 2
            }  # fmt: skip
            assert [row["at"] for row in page["rows"]] == sorted((row["at"] for row in page["rows"]), reverse=True)
            assert rows["two-0"]["outcome"] == "trimmed" and rows["two-0"]["removed_count"] > 0
            assert rows["two-0"]["removed"] and rows["two-0"]["by_strategy"]
            assert page["workers"]["answered"] == [1, 2] and page["workers"]["missing"] == []

    async def test_the_html_says_it_shows_all_workers_and_whose_each_row_is(self, workers):
        (first, _), (second, _) = workers
        await send(second, "from-two")
        html = await page_html(first)
        assert "From all 2 workers (this page from worker 1)." in html and "<div class=minor>worker 2</div>" in html

    async def test_a_worker_that_does_not_answer_is_named_and_the_others_rows_still_show(self, workers):
        (first, _), (second, own_second) = workers
        await send(first, "kept")
        await send(second, "lost")
        await own_second.cleanup()  # as a worker that is restarting
        page = await page_json(first)
        assert [row["request_id"] for row in page["rows"]] == ["kept"]
        assert page["workers"] == {"count": 2, "answered": [1], "missing": [2], "served_by": 1}
        assert "worker 2 did not answer in time, so its decisions are missing" in await page_html(first)


class TestDecisionsBetweenWorkers:
    def test_a_decision_read_back_from_its_json_shows_the_same_with_its_worker(self):
        record = RequestRecord("r-1", "POST", "/v1/chat/completions", kind="chat", model="gpt-4o", upstream="fake")
        record.notes.append("estimate")
        record.finish(200)
        decision = Decision(record)
        again = Decision.from_dict(decision.to_dict(), 2)
        assert again.to_dict() == {**decision.to_dict(), "worker": 2} and again.matches(PageQuery(model="4o"))

    def test_a_ring_s_own_decisions_are_copied_when_given_a_worker(self):
        recent = RecentDecisions(4)
        record = RequestRecord("r-2", "POST", "/v1/chat/completions", kind="chat")
        record.finish(200)
        recent.add(record)
        (mine,) = recent.decisions
        assert mine.of_worker(1).worker == 1 and mine.worker is None

    async def test_the_latest_correction_of_a_pair_wins_whichever_worker_saw_it(self, sockets, aiohttp_server):
        """Worker 2 learned a correction later than worker 1 applied one: the page shows worker 2's."""
        older, newer = RecentDecisions(4), RecentDecisions(4)
        for ring, window, at in ((older, 6000, 100.0), (newer, 5000, 200.0)):
            record = RequestRecord("r", "POST", "/v1/chat/completions", kind="chat", model="m", upstream="u")
            record.learned_correction = Correction(window=window, factor=1.0, provider="openai", limit=window)
            record.at = at
            record.finish(400)
            ring.add(record)
        theirs = await serve_own(newer, Peers(sockets, 2, 2))
        try:
            merged = await Peers(sockets, 1, 2).gather(older)
        finally:
            await theirs.cleanup()
        assert merged.corrections[("u", "m")]["corrected_window"] == 5000 and len(merged.decisions) == 2
