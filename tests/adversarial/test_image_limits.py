"""An image is counted only within what the provider accepts. A 33-byte PNG header may claim any
size: Anthropic refuses an image with a side over 8,000 px, so the guard refuses it too, in
Anthropic's shape and words, before anything is sent (the control: a header of a size Anthropic
takes is forwarded); Gemini scales any image down to fit 3,072 px, so there it costs 16 tiles at
most (tests/adversarial/test_media_rates.py), and OpenAI's tiles fit it in 2,048 px. None of them
counts the 2e15 tokens the claimed size would make.
"""

from __future__ import annotations

import json
from typing import Any

from tests.adversarial.conftest import post
from tests.adversarial.media_files import b64, png_header


def claude(width: int, height: int) -> bytes:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(png_header(width, height))}}
    content = [image, {"type": "text", "text": "What is it?"}]
    return json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 16, "messages": [{"role": "user", "content": content}]}).encode()


def sent(guard: Any) -> int:
    return len(guard.upstream.received) if guard.upstream is not None else 0


class TestOnAnthropic:
    async def test_an_image_over_8000_pixels_a_side_is_refused_as_anthropic_refuses_it(self, serve_guard):
        guard = await serve_guard()
        status, answer, _ = await post(guard.url("/v1/messages"), claude(2**31 - 1, 2**31 - 1))
        error = json.loads(answer)
        assert status == 400 and error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
        assert "8000 pixels" in error["error"]["message"]
        assert sent(guard) == 0

    async def test_an_image_of_a_size_it_takes_is_forwarded(self, serve_guard):
        """The control."""
        guard = await serve_guard()
        status, answer, _ = await post(guard.url("/v1/messages"), claude(8000, 6000))
        assert status == 200, answer[:300]
        assert sent(guard) == 1

