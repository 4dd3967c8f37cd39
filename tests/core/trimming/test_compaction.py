"""Compaction, the pure part: the dropped span, its hash, and the summary put in its place."""

from __future__ import annotations

from typing import Any

from proxy.core.counting.request_count import RequestCounter
from proxy.core.trimming.compaction import summariser_messages, summary_request, with_summary
from tests.support.trimming import fit, profile, request, tokenizer

WINDOW = 3000


def counter() -> RequestCounter:
    return RequestCounter(profile(WINDOW), tokenizer())


def planned(turns: int, summarize: bool = True) -> tuple[dict[str, Any], Any]:
    body = request(turns)
    return body, fit(body, WINDOW, summarize=summarize).result


class TestSummaryRequest:
    def test_there_is_none_unless_summarize_dropped_is_on(self):
        body, result = planned(30, summarize=False)
        assert result.outcome == "trimmed" and summary_request(body, result) is None

    def test_the_span_is_every_message_dropped_whole_in_order(self):
        body, result = planned(30)
        span = summary_request(body, result)
        dropped = [r.index for r in result.removals if r.kind == "dropped"]
        assert span is not None and list(span.indices) == dropped
        assert list(span.messages) == [body["messages"][i] for i in dropped]
        assert span.max_tokens == result.summary_room > 0

    def test_the_next_turn_cut_at_the_same_place_has_the_same_span_hash(self):
        (body_a, a), (body_b, b) = planned(30), planned(31)
        assert a.cut is not None and b.cut is not None and a.cut.position == b.cut.position
        span_a, span_b = summary_request(body_a, a), summary_request(body_b, b)
        assert span_a is not None and span_b is not None and span_a.span_hash == span_b.span_hash

    def test_the_summariser_sees_the_span_as_a_transcript_capped_at_its_newest_characters(self):
        body, result = planned(30)
        span = summary_request(body, result)
        assert span is not None
        asked = summariser_messages(span, max_input_chars=500)
        assert asked[0]["role"] == "system" and asked[1]["content"].startswith(f"Transcript of {len(span.indices)}")
        assert "[... earlier part omitted ...]" in asked[1]["content"] and len(asked[1]["content"]) < 700


class TestWithSummary:
    def test_a_summary_goes_in_where_the_dropped_messages_were_marked_and_counted_within_the_budget(self):
        body, result = planned(30)
        span = summary_request(body, result)
        assert span is not None
        done = with_summary(result, span, "They discussed lorem ipsum.", "produced", counter())
        at = result.insert_at
        message = done.body["messages"][at]
        assert message["role"] == "system" and message["content"].startswith(f"[Summary of {len(span.indices)}")
        assert done.body["messages"][:at] == result.body["messages"][:at]  # the opening before it
        assert done.body["messages"][at + 1] is result.body["messages"][at]  # the first message after the cut
        assert body["messages"].index(done.body["messages"][at + 1]) > max(span.indices)
        assert done.fits and done.tokens_after == counter().request(done.body).total > result.tokens_after
        assert done.summary is not None and done.summary.to_dict()["status"] == "produced"
        assert done.inserted == (at,) and done.insert_at == at + 1

    def test_a_reused_summary_is_reported_as_reused(self):
        body, result = planned(30)
        span = summary_request(body, result)
        assert span is not None
        done = with_summary(result, span, "Earlier: lorem.", "reused", counter())
        assert done.summary is not None and done.summary.status == "reused" and done.summary.inserted

    def test_a_summary_longer_than_its_room_is_left_out_as_oversize(self):
        body, result = planned(30)
        span = summary_request(body, result)
        assert span is not None
        done = with_summary(result, span, "lorem " * 5000, "produced", counter())
        assert done.body == result.body and done.summary is not None and done.summary.status == "oversize"

    def test_no_summary_after_a_timeout_or_failure_leaves_the_plain_cut(self):
        body, result = planned(30)
        span = summary_request(body, result)
        assert span is not None
        for status in ("timeout", "failed"):
            done = with_summary(result, span, None, status, counter())  # type: ignore[arg-type]
            assert done.body is result.body and done.tokens_after == result.tokens_after
            assert done.summary is not None and (done.summary.status, done.summary.tokens) == (status, 0)
