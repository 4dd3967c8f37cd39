"""A PDF whose page tree states no `/Count` and never closes costs work linear in its bytes.

The worst such body that is still planned on the loop (at most `INLINE_BYTES`) and one that
inflates to `FILE_INFLATE_CAP` are sent while the guard's loop is watched; each is answered with
a clean error in the API's shape (the file is counted by its inflated bytes: over the window).
"""

from __future__ import annotations

import base64
import json

import pytest

from proxy.core.costs.media import FILE_INFLATE_CAP
from proxy.server.threads.placement import INLINE_BYTES
from tests.adversarial.conftest import anthropic_body_of, assert_refused_over_window, body_of, post
from tests.adversarial.hostile import chat_with_file, honest_pdf, pdf_no_larger_than, pdf_without_count

CHAT = "/v1/chat/completions"
ON_THE_LOOP = pdf_no_larger_than(INLINE_BYTES - 300)  # the body around it stays under INLINE_BYTES
AT_THE_CAP = pdf_without_count(FILE_INFLATE_CAP)
# The body at the cap is planned in a thread, but the page-count scan of its inflated text is one
# C call that holds the GIL, so the loop waits for it: that shows as lateness, not as the loop's
# own CPU. Scanning in slices (in the core) would let the loop run between them.


async def warmed(guard):  # type: ignore[no-untyped-def]
    """The guard with its vocabularies loaded (once per process, holding the GIL): not the attack's."""
    await post(guard.url(CHAT), body_of("warm up"))
    await post(guard.url("/v1/messages"), anthropic_body_of("warm up"))
    return guard


def anthropic_document(pdf: bytes) -> bytes:
    source = {"type": "base64", "media_type": "application/pdf", "data": base64.b64encode(pdf).decode()}
    content = [{"type": "document", "source": source}, {"type": "text", "text": "Summarise it."}]
    body = {"model": "claude-3-5-sonnet-20241022", "max_tokens": 16, "messages": [{"role": "user", "content": content}]}
    return json.dumps(body).encode()


def responses_input_file(pdf: bytes) -> bytes:
    part = {"type": "input_file", "filename": "report.pdf",
            "file_data": "data:application/pdf;base64," + base64.b64encode(pdf).decode()}  # fmt: skip
    return json.dumps({"model": "gpt-4o", "input": [{"role": "user", "content": [part]}]}).encode()


class TestPdfWithoutCount:
    def test_the_small_attack_is_planned_on_the_loop(self) -> None:
        """The case that matters for the loop: the body is not sent to a thread."""
        assert len(chat_with_file(ON_THE_LOOP)) <= INLINE_BYTES

    @pytest.mark.parametrize(
        "pdf",
        [
            pytest.param(ON_THE_LOOP, id="on-the-loop"),
            pytest.param(AT_THE_CAP, id="at-the-inflate-cap"),
        ],
    )
    async def test_a_pdf_without_count_does_not_stall_the_loop(self, serve_guard, prober, pdf: bytes) -> None:
        guard = await warmed(await serve_guard())
        body = chat_with_file(pdf)
        base = await prober.baseline(guard)
        async with prober.during(guard) as during:
            answers = [await post(guard.url(CHAT), body) for _ in range(8)]
        prober.assert_responsive(base, during)
        assert_refused_over_window(answers)
        assert guard.upstream is not None and len(guard.upstream.received) == 2  # the warm-ups: nothing over the window

    async def test_an_honest_pdf_of_the_same_size_is_forwarded(self, serve_guard) -> None:
        guard = await serve_guard()
        status, answer, _ = await post(guard.url(CHAT), chat_with_file(honest_pdf(len(ON_THE_LOOP))))
        assert status == 200 and json.loads(answer)["object"] == "chat.completion"

    async def test_anthropic_documents_and_responses_files_do_not_stall_the_loop(self, serve_guard, prober) -> None:
        guard = await warmed(await serve_guard())
        base = await prober.baseline(guard)
        async with prober.during(guard) as during:
            answers = [
                await post(guard.url(path), body)
                for path, body in [("/v1/messages", anthropic_document(ON_THE_LOOP)),
                                   ("/v1/responses", responses_input_file(ON_THE_LOOP))] * 4
            ]  # fmt: skip
        prober.assert_responsive(base, during)
        for (anthropic_status, anthropic, _), (responses_status, responses, _) in zip(
            answers[::2], answers[1::2], strict=True
        ):
            assert anthropic_status == 400 and json.loads(anthropic)["type"] == "error", anthropic[:300]
            assert responses_status == 400 and json.loads(responses)["error"]["type"] == "invalid_request_error"
