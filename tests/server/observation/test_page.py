"""The page of recent decisions: what it keeps, what it shows, and to whom."""

from __future__ import annotations

import base64
import json
from typing import Any
from unittest import mock

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request

from proxy.core.learning.corrections import Correction
from proxy.errors import HTTPRefusal
from proxy.server.observation.page import JSON_PATH, PAGE_PATH, recent_json
from proxy.server.observation.recent import EAGER_REMOVALS, MAX_RUNS, RECENT, PageQuery, RecentDecisions
from proxy.server.observation.record import RequestRecord
from proxy.server.process.app import create_app
from tests.server.conftest import gateway_settings, long_conversation
from tests.support.page_traffic import SECRET_WORDS, chat, make_traffic

HOSTILE_MODEL = '<script>alert("model")</script>'


async def get(proxy: Any, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.get(proxy.make_url(path), headers=headers or {}) as r:
            return r.status, await r.text(), r.headers


def a_record(request_id: str, status: int = 200, kind: str = "chat", **fields: Any) -> RequestRecord:
    record = RequestRecord(request_id, "POST", "/v1/chat/completions", kind=kind, **fields)
    record.finish(status)
    return record


class TestRecentDecisions:
    def test_keeps_only_the_last_size_decisions_newest_first(self):
        recent = RecentDecisions(3)
        for i in range(5):
            recent.add(a_record(f"r{i}", model="gpt-4o"))
        assert [d.request_id for d in recent.rows(PageQuery())] == ["r4", "r3", "r2"]

    def test_does_not_keep_the_pages_own_views_probes_or_scrapes(self):
        recent = RecentDecisions(10)
        recent.add(a_record("view", kind="local"))
        recent.add(a_record("unauthorised", status=401, kind="local"))
        assert [d.request_id for d in recent.rows(PageQuery())] == ["unauthorised"]

    def test_filters_by_request_id_substring_model_substring_and_exact_outcome(self):
        recent = RecentDecisions(10)
        recent.add(a_record("abc-1", model="gpt-4o", outcome="trimmed"))
        recent.add(a_record("abc-2", model="team-fast", served_model="meta-llama/Llama-3.1-8B", outcome="unchanged"))
        recent.add(a_record("xyz-3", model="gpt-4o-mini", outcome="trimmed"))

        def ids(**query: str) -> list[str]:
            return [d.request_id for d in recent.rows(PageQuery(**query))]

        assert ids(request_id="abc") == ["abc-2", "abc-1"]
        assert ids(model="LLAMA") == ["abc-2"]
        assert ids(outcome="trimmed", model="gpt-4o") == ["xyz-3", "abc-1"]
        assert ids(outcome="trim") == []

    def test_keeps_the_latest_correction_per_upstream_and_served_model(self):
        recent = RecentDecisions(10)
        first, later = Correction(6000, 1.25, "openai", 8192), Correction(5800, 1.3, "openai", 8192)
        recent.add(a_record("a", model="gpt-4", upstream="fake", learned_correction=first))
        recent.add(a_record("b", model="gpt-4", upstream="fake", applied_correction=later))
        recent.add(a_record("c", model="gpt-4", upstream="other", learned_correction=first))
        table = recent.to_dict(PageQuery())["corrections"]
        assert [(c["upstream"], c["model"], c["corrected_window"], c["source"]) for c in table] == [
            ("other", "gpt-4", 6000, "learned"),
            ("fake", "gpt-4", 5800, "applied"),
        ]

    def test_the_correction_table_stays_bounded_whatever_models_clients_name(self):
        recent = RecentDecisions(10)
        for i in range(1000):
            recent.add(a_record(f"r{i}", model=f"m{i}", upstream="fake", learned_correction=Correction(6000, 1.0, "x")))
        assert len(recent.corrections) <= 256 and ("fake", "m999") in recent.corrections

    def test_a_size_below_one_is_refused_with_the_key_named(self):
        with pytest.raises(ValueError, match=r"page\.size"):
            RecentDecisions(0)


class TestThePage:
    async def test_lists_trimmed_rejected_and_plain_requests_with_their_numbers(self, proxy):
        expected = await make_traffic(proxy)
        status, text, _ = await get(proxy, JSON_PATH)
        rows = json.loads(text)["rows"]
        assert status == 200 and {r["request_id"]: r["outcome"] for r in rows} == expected
        assert [r["request_id"] for r in rows] == list(reversed(expected))
        trimmed = rows[-1]
        assert trimmed["tokens_before"] > trimmed["budget"] >= trimmed["tokens_after"] > 0
        assert trimmed["removed"][0]["strategy"] == "drop_oldest_turns" and trimmed["removed_count"] > 0
        assert trimmed["time"].endswith("Z") and trimmed["upstream"] == "fake"

    async def test_a_request_that_removed_hundreds_shows_their_totals_with_its_runs_folded_to_a_dozen(self, proxy):
        assert await chat(proxy, {"model": "gpt-4", "messages": long_conversation(400, 6)}, "many") == 200
        decision = proxy.app[RECENT].decisions[-1]
        row = json.loads((await get(proxy, JSON_PATH))[1])["rows"][0]
        assert row["removed_count"] > EAGER_REMOVALS and len(row["removed"]) <= MAX_RUNS
        assert sum(s["count"] for s in row["by_strategy"].values()) == row["removed_count"]
        assert sum(s["tokens"] for s in row["by_strategy"].values()) == row["removed_tokens"]
        assert decision._removals == ()  # folded when taken: the ring holds a dozen runs, not the removals

    async def test_a_message_removed_alone_is_shown_without_its_content_hash(self, proxy, logs):
        """Any client key reads the page: a hash of a short secret (a PIN at the end of a known
        form) is that secret to whoever tries the guesses. The operator's log keeps it."""
        form = "Card services terms and conditions, version 7. " * 900
        body = {
            "model": "gpt-4",
            "messages": [
                {"role": "system", "content": "You are a banking assistant."},
                {"role": "user", "content": form + "My card PIN is 4821."},
                {"role": "user", "content": "Which of these terms apply to me?"},
            ],
        }
        assert await chat(proxy, body, "pin") == 200
        (removed,) = json.loads((await get(proxy, JSON_PATH))[1])["rows"][0]["removed"]
        assert removed["what"] == "message 1" and "hash" not in removed
        (logged,) = [e for e in logs.events("request") if e["request_id"] == "pin"]
        assert logged["removed"][0]["hash"]

    async def test_the_html_shows_the_same_rows_with_a_bar_and_never_any_content(self, proxy):
        await make_traffic(proxy)
        status, page, headers = await get(proxy, PAGE_PATH)
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert page.count('class="decision ') == 5 and page.count('class="bar') == 5
        assert "drop_oldest_turns" in page and "trim-1" in page and "reject-1" in page
        assert SECRET_WORDS not in page and "rule rule" not in page and "hi</" not in page
        assert "script-src" not in headers["Content-Security-Policy"] and "<script" not in page

    async def test_the_outcome_filter_in_the_url_keeps_only_that_outcome(self, proxy):
        await make_traffic(proxy)
        _, page, _ = await get(proxy, f"{PAGE_PATH}?outcome=trimmed")
        assert page.count('class="decision ') == 2 and "reject-1" not in page and "plain-1" not in page
        assert '<option value="trimmed" selected>' in page
        _, text, _ = await get(proxy, f"{JSON_PATH}?outcome=rejected")
        assert [r["request_id"] for r in json.loads(text)["rows"]] == ["reject-1"]

    async def test_model_names_and_request_ids_from_clients_are_escaped(self, proxy):
        hostile_id = '"><img/src=x/onerror=alert(1)>'
        await chat(proxy, {"model": HOSTILE_MODEL, "messages": [{"role": "user", "content": "hi"}]}, hostile_id)
        _, page, _ = await get(proxy, f"{PAGE_PATH}?model=%3Cscript")
        assert HOSTILE_MODEL not in page and hostile_id not in page
        assert "&lt;script&gt;alert(&quot;model&quot;)&lt;/script&gt;" in page
        assert "&quot;&gt;&lt;img/src=x/onerror=alert(1)&gt;" in page
        assert 'value="&lt;script"' in page  # the filter's own echo, escaped too

    async def test_shows_the_correction_an_upstream_taught(self, proxy, upstream):
        upstream.limit, upstream.provider_factor = 6000, 1.25
        assert await chat(proxy, {"model": "gpt-4", "messages": long_conversation()}) == 200
        _, text, _ = await get(proxy, JSON_PATH)
        (correction,) = json.loads(text)["corrections"]
        assert (
            correction["upstream"] == "fake"
            and correction["model"] == "gpt-4"
            and correction["corrected_window"] < 6000
        )
        _, page, _ = await get(proxy, PAGE_PATH)
        assert "id=corrections" in page and f"{correction['corrected_window']:,}" in page

    async def test_shows_calibration_ratios_when_something_feeds_them(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url))
        _, page, _ = await get(proxy, PAGE_PATH)
        assert "Calibration" not in page and "No decisions match." in page
        proxy.app[RECENT].calibration["gpt-4o"] = 1.0625
        _, page, _ = await get(proxy, PAGE_PATH)
        assert "id=calibration" in page and "1.062" in page


class TestWhoMaySeeIt:
    async def test_is_not_served_when_switched_off(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url, page={"enabled": False}))
        for path in (PAGE_PATH, JSON_PATH):
            status, text, _ = await get(proxy, path)
            assert status == 404 and "page.enabled" in json.loads(text)["error"]["message"]

    async def test_with_client_keys_it_needs_one_as_bearer_or_as_a_browsers_password(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url, server={"client_keys": ["ck-1"]}))
        status, _, headers = await get(proxy, PAGE_PATH)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic ")
        assert (await get(proxy, PAGE_PATH, {"Authorization": "Bearer wrong"}))[0] == 401
        assert (await get(proxy, PAGE_PATH, {"Authorization": "Bearer ck-1"}))[0] == 200
        basic = base64.b64encode(b"operator:ck-1").decode()
        assert (await get(proxy, JSON_PATH, {"Authorization": f"Basic {basic}"}))[0] == 200

    async def test_its_own_admin_key_opens_it_and_client_keys_do_not(self, start_proxy, upstream, monkeypatch):
        monkeypatch.setenv("CG_PAGE_KEY", "admin-1")
        settings = gateway_settings(
            upstream.url, server={"client_keys": ["ck-1"]}, page={"admin_key_env": "CG_PAGE_KEY"}
        )
        proxy = await start_proxy(settings)
        assert (await get(proxy, PAGE_PATH, {"Authorization": "Bearer ck-1"}))[0] == 401
        assert (await get(proxy, PAGE_PATH, {"Authorization": "Bearer admin-1"}))[0] == 200
        assert (await get(proxy, PAGE_PATH, {"x-api-key": "admin-1"}))[0] == 200

    async def test_an_admin_key_variable_left_unset_locks_it_and_says_why(self, start_proxy, upstream, monkeypatch):
        monkeypatch.delenv("CG_PAGE_KEY", raising=False)
        proxy = await start_proxy(gateway_settings(upstream.url, page={"admin_key_env": "CG_PAGE_KEY"}))
        status, text, _ = await get(proxy, PAGE_PATH)
        assert status == 403 and "CG_PAGE_KEY" in json.loads(text)["error"]["message"]

    async def test_with_no_key_at_all_only_loopback_clients_may_read_it(self, upstream):
        app = create_app(gateway_settings(upstream.url))
        transport = mock.Mock()
        transport.get_extra_info.side_effect = lambda name, default=None: (
            ("10.1.2.3", 5000) if name == "peername" else default
        )
        request = make_mocked_request("GET", JSON_PATH, app=app, transport=transport)
        with pytest.raises(HTTPRefusal) as refused:
            await recent_json(request)
        assert refused.value.status == 403 and "loopback" in refused.value.message
