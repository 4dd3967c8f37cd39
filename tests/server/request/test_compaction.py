"""The summariser against a real in-process OpenAI-compatible upstream that can answer well, late,
too much, or badly."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from proxy.core.counting.request_count import RequestCounter
from proxy.core.trimming.compaction import SummaryRequest, summary_request, with_summary
from proxy.core.trimming.trim import content_digest
from proxy.server.request.summariser import Summariser, SummariserOptions
from tests.support.trimming import fit, profile, tokenizer, words


class FakeSummariser:
    """Answers chat completions with `reply`, after `delay` seconds, or with `status`."""

    def __init__(self) -> None:
        self.reply: Any = "The user asked about orders; 3 were shipped."
        self.delay = 0.0
        self.status = 200
        self.calls: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.calls.append(await request.json())
        await asyncio.sleep(self.delay)
        if self.status != 200:
            return web.json_response({"error": {"message": "overloaded"}}, status=self.status)
        if isinstance(self.reply, bytes):
            return web.Response(body=self.reply, content_type="application/json")
        return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": self.reply}}]})


@pytest.fixture
async def fake(aiohttp_server: Any) -> tuple[FakeSummariser, str]:
    summariser = FakeSummariser()
    server = await aiohttp_server(summariser.app())
    return summariser, str(server.make_url("/v1/chat/completions"))


def span(tag: str = "a", room: int = 400, log_hash: str | None = None) -> SummaryRequest:
    messages = ({"role": "user", "content": f"question {tag}"}, {"role": "assistant", "content": f"answer {tag}"})
    digest = content_digest(list(messages))
    return SummaryRequest(log_hash or digest[:12], (1, 2), messages, room, digest)


async def summarise(url: str, request: SummaryRequest, **options: Any) -> Any:
    async with aiohttp.ClientSession() as session:
        summariser = Summariser(SummariserOptions(url=url, model="small", **options), session)
        return await summariser.summarise(request)


class TestSummariser:
    async def test_a_good_answer_is_produced_and_the_call_names_the_model_and_a_size_cap(self, fake):
        upstream, url = fake
        outcome = await summarise(url, span())
        assert (outcome.status, outcome.text) == ("produced", "The user asked about orders; 3 were shipped.")
        call = upstream.calls[0]
        assert call["model"] == "small" and call["max_tokens"] < 400 and "question a" in call["messages"][1]["content"]

    async def test_the_same_span_is_reused_from_the_cache_without_a_second_call(self, fake):
        upstream, url = fake
        async with aiohttp.ClientSession() as session:
            summariser = Summariser(SummariserOptions(url=url, model="small"), session)
            first = await summariser.summarise(span())
            second = await summariser.summarise(span())
            other = await summariser.summarise(span("b"))
        assert (first.status, second.status, other.status) == ("produced", "reused", "produced")
        assert second.text == first.text and len(upstream.calls) == 2

    async def test_spans_that_share_only_their_log_hash_are_never_given_each_others_summary(self, fake):
        """The log's 12-digit hash can be matched by another client's span with enough tries: the
        cache is keyed by the whole digest."""
        upstream, url = fake
        async with aiohttp.ClientSession() as session:
            summariser = Summariser(SummariserOptions(url=url, model="small"), session)
            mine = await summariser.summarise(span("mine", log_hash="0123456789ab"))
            theirs = await summariser.summarise(span("theirs", log_hash="0123456789ab"))
        assert (mine.status, theirs.status) == ("produced", "produced") and len(upstream.calls) == 2
        assert "question theirs" in upstream.calls[1]["messages"][1]["content"]

    async def test_a_summary_written_for_one_room_is_not_reused_for_another(self, fake):
        upstream, url = fake
        async with aiohttp.ClientSession() as session:
            summariser = Summariser(SummariserOptions(url=url, model="small"), session)
            outcomes = [await summariser.summarise(span(room=room)) for room in (400, 120, 400)]
        assert [o.status for o in outcomes] == ["produced", "produced", "reused"] and len(upstream.calls) == 2

    async def test_concurrent_requests_for_one_span_share_one_call(self, fake):
        upstream, url = fake
        upstream.delay = 0.2
        async with aiohttp.ClientSession() as session:
            summariser = Summariser(SummariserOptions(url=url, model="small"), session)
            outcomes = await asyncio.gather(*(summariser.summarise(span()) for _ in range(3)))
        assert sorted(o.status for o in outcomes) == ["produced", "reused", "reused"] and len(upstream.calls) == 1

    async def test_a_summariser_slower_than_the_deadline_times_out(self, fake):
        upstream, url = fake
        upstream.delay = 1.0
        outcome = await summarise(url, span(), deadline_seconds=0.1)
        assert (outcome.status, outcome.text) == ("timeout", None)

    async def test_an_answer_over_the_size_cap_is_oversize(self, fake):
        upstream, url = fake
        upstream.reply = "x" * 5000
        outcome = await summarise(url, span(), max_response_bytes=1000)
        assert (outcome.status, outcome.text) == ("oversize", None)

    @pytest.mark.parametrize("status, reply", [(503, ""), (200, b"not json"), (200, b'{"choices": []}'), (200, "  ")])
    async def test_an_error_or_an_unusable_answer_fails(self, fake, status, reply):
        upstream, url = fake
        upstream.status, upstream.reply = status, reply
        outcome = await summarise(url, span())
        assert (outcome.status, outcome.text) == ("failed", None)

    async def test_an_unreachable_summariser_fails(self):
        outcome = await summarise("http://127.0.0.1:9/v1/chat/completions", span(), deadline_seconds=2)
        assert outcome.status == "failed"

    async def test_failures_are_not_cached(self, fake):
        upstream, url = fake
        async with aiohttp.ClientSession() as session:
            summariser = Summariser(SummariserOptions(url=url, model="small"), session)
            upstream.status = 500
            failed = await summariser.summarise(span())
            upstream.status = 200
            produced = await summariser.summarise(span())
        assert (failed.status, produced.status) == ("failed", "produced")

    def test_bad_options_are_refused_with_the_reason(self):
        with pytest.raises(ValueError, match="url must start with http"):
            SummariserOptions(url="ftp://x", model="m")
        with pytest.raises(ValueError, match="deadline_seconds must be positive"):
            SummariserOptions(url="http://x", model="m", deadline_seconds=0)


class TestSummaryInTheTrimmedRequest:
    async def test_a_produced_summary_goes_in_where_the_dropped_messages_were_and_is_counted(self, fake):
        upstream, url = fake
        messages: list[dict[str, Any]] = [{"role": "system", "content": "rules"}]
        for i in range(30):
            messages += [
                {"role": "user", "content": f"q{i} " + words(100)},
                {"role": "assistant", "content": f"a{i} " + words(100)},
            ]
        body = {"messages": [*messages, {"role": "user", "content": "latest"}]}
        plan = fit(body, 4000, summarize=True)
        request = summary_request(body, plan.result)
        assert request is not None
        async with aiohttp.ClientSession() as session:
            outcome = await Summariser(SummariserOptions(url=url, model="small"), session).summarise(request)
        result = with_summary(plan.result, request, outcome.text, outcome.status, plan.counter)
        kept = result.body["messages"]
        at = plan.result.insert_at  # after the opening the trim kept
        assert kept[0]["content"] == "rules" and kept[at]["content"].startswith("[Summary of")
        assert kept[:at] == plan.result.body["messages"][:at]
        assert result.summary is not None and result.summary.status == "produced" and result.fits
        counter = RequestCounter(profile(4000), tokenizer())
        assert counter.request(result.body).total == result.tokens_after
        first_dropped = body["messages"][request.indices[0]]["content"][:4]
        assert json.dumps(upstream.calls[0]).count(first_dropped) == 1
