"""A malicious or broken upstream is bounded too: an SSE event that never ends is held only up
to a bound and then relayed unparsed; a hung `/tokenize` costs one request its `tokenize_timeout`
(not the framing's longer deadline) and then sets a cooldown, so the next requests do not ask
it; a huge tokenize answer is not read whole, nor parsed on the loop.
"""

from __future__ import annotations

import json

import aiohttp
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.server.backends.profiles import MAX_ANSWER_BYTES
from proxy.server.upstream.usage import MAX_EVENT_BYTES, UsageTap
from tests.adversarial.conftest import body_of, make_settings, post
from tests.adversarial.upstreams import CHUNK, TOKENIZE_CALLS, USAGE, endless_event_upstream, llama_server, sse


class TestEndlessEvent:
    async def test_an_event_larger_than_the_bound_is_relayed_unparsed_while_the_loop_stays_responsive(
        self, serve_guard, prober
    ):
        size = 64 * 1024 * 1024
        guard = await serve_guard(upstream=endless_event_upstream(size))
        base = await prober.baseline(guard)
        body = body_of("hello", stream=True, stream_options={"include_usage": True})
        async with prober.during(guard) as during:
            status, length, tail = await streamed(guard.url("/v1/chat/completions"), body)
        assert status == 200
        assert length > size and tail.endswith(sse(USAGE) + b"data: [DONE]\n\n")  # every byte relayed
        prober.assert_responsive(base, during)


async def streamed(url: str, body: bytes) -> tuple[int, int, bytes]:
    """POST `body` and read the answer as it comes: (status, bytes received, the last 4 KB)."""
    length, tail = 0, b""
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
        session.post(url, data=body, headers={"Content-Type": "application/json"}) as response,
    ):
        async for chunk in response.content.iter_any():
            length += len(chunk)
            tail = (tail + chunk)[-4096:]
        return response.status, length, tail


class TestUsageTapBounds:
    def test_a_partial_event_is_held_only_up_to_the_bound_then_relayed_as_it_comes(self):
        tap = UsageTap(strip=False)
        out = [tap.feed(b'data: {"x": "')]
        for _ in range(3 * MAX_EVENT_BYTES // CHUNK):
            out.append(tap.feed(b"a" * CHUNK))
            assert len(tap._pending) <= MAX_EVENT_BYTES
        out.append(tap.feed(b'"}\n\n' + sse(USAGE)))
        assert tap.oversized == 1 and tap.usage is not None and tap.usage.prompt_tokens == 7

    @settings(max_examples=60, deadline=None)
    @given(
        events=st.lists(
            st.one_of(
                st.binary(max_size=64).map(lambda b: b"data: " + b.replace(b"\n", b"").replace(b"\r", b"") + b"\n\n"),
                st.just(b": ping\r\n\r\n"),
                st.just(sse(USAGE)),
                st.just(b"data: " + b"z" * (MAX_EVENT_BYTES + 10) + b"\n\n"),
                st.just(b"data: [DONE]\n\n"),
            ),
            max_size=8,
        ),
        cuts=st.lists(st.integers(min_value=1, max_value=MAX_EVENT_BYTES // 2), max_size=12),
    )
    def test_without_stripping_the_stream_goes_through_byte_for_byte_however_it_is_chunked(self, events, cuts):
        stream = b"".join(events)
        tap, out, at = UsageTap(strip=False), [], 0
        for cut in [*cuts, len(stream)]:
            out.append(tap.feed(stream[at : at + cut]))
            at += cut
        out.append(tap.finish())
        assert b"".join(out) == stream


def backend_settings(url: str):
    upstream = {"base_url": url, "kind": "auto", "tokenize": "auto", "tokenize_timeout": 0.5, "read_timeout": 10}
    return make_settings(url, upstreams={"local": upstream}, routes=[{"match": "*", "upstream": "local"}])


class TestTokenizeBackend:
    async def test_a_hung_tokenize_costs_a_request_at_most_the_tokenize_timeout_and_then_nothing(self, serve_guard):
        """The client's timeout (15 s) is far under the framing's deadline (30 s), which is what a
        request would wait were `tokenize_timeout` (0.5 s) not applied; the cooldown shows as no
        further `/tokenize` call."""
        hung = llama_server("hang")
        guard = await serve_guard(backend_settings, upstream=hung)
        chat = guard.url("/v1/chat/completions")
        status, _, _ = await post(chat, body_of("hello there", model="local"), timeout=15)
        assert status == 200
        asked = len(hung[TOKENIZE_CALLS])
        assert asked >= 1  # the framing's measurement: it hangs
        for _ in range(3):  # the backend cools down: the next requests do not ask it at all
            status, _, _ = await post(chat, body_of("and again", model="local"), timeout=15)
            assert status == 200
        assert len(hung[TOKENIZE_CALLS]) == asked

    async def test_a_huge_tokenize_answer_is_not_read_whole_and_the_loop_stays_responsive(self, serve_guard, prober):
        guard = await serve_guard(backend_settings, upstream=llama_server("huge"))
        base = await prober.baseline(guard)
        async with prober.during(guard) as during:
            status, answer, _ = await post(guard.url("/v1/chat/completions"), body_of("hello", model="local"))
        assert status == 200 and json.loads(answer)["object"] == "chat.completion", answer[:200]
        prober.assert_responsive(base, during)
        assert MAX_ANSWER_BYTES < 16 * 1024 * 1024  # the fake's answer is over the bound the guard reads up to
