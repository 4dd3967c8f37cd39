"""Media are counted at the provider's documented rates, never under them, on files made by real
encoders, through a real guard's Gemini `countTokens` (the guard answers it from the count it
plans with). The rates, as Google publishes them:

- a PDF page: 258 tokens on Gemini 2.x (https://ai.google.dev/gemini-api/docs/document-processing),
  MEDIUM's 560 by default on Gemini 3 (https://ai.google.dev/gemini-api/docs/media-resolution);
- video: a frame a second at 258 tokens, sound at 32 a second, timestamps: "about 300 tokens per
  second" (https://ai.google.dev/gemini-api/docs/video-understanding); the guard counts 300;
- audio: 32 tokens a second (https://ai.google.dev/gemini-api/docs/tokens);
- an image on Gemini 2.x: 258 a 768 px tile after scaling to fit 3072 x 3072, so at most 16 tiles.

google-genai's own local tokenizer is no reference for these: it refuses any part that is not
text (checked below), so the published rates are.

Each finding has its control: the same pages without object streams, the same sound without a
`JUNK` chunk, a real image's header beside a forged one.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from google.genai import types
from google.genai.local_tokenizer import _TextsAccumulator

from tests.adversarial.conftest import post
from tests.adversarial.media_files import audio, b64, pdf, png_header, video, with_junk_before_format

FLASH = "gemini-2.5-flash"
GEMINI_3 = "gemini-3-pro-preview"
PROMPT_SLACK = 40  # the text part and the turn's framing, counted besides the medium
VIDEO_RATE = 300  # tokens a second: 258 (a frame) + 32 (sound) + 10 (timestamps)


async def count(guard: Any, model: str, mime: str, data: bytes, **part: Any) -> int:
    """The guard's `countTokens` answer for one user turn of the medium and a short question."""
    inline = {"inlineData": {"mimeType": mime, "data": b64(data)}, **part}
    body = {"contents": [{"role": "user", "parts": [inline, {"text": "What is in it?"}]}]}
    status, answer, _ = await post(guard.url(f"/v1beta/models/{model}:countTokens"), json.dumps(body).encode())
    assert status == 200, answer[:300]
    total: int = json.loads(answer)["totalTokens"]
    return total


class TestPdfPages:
    async def test_pages_in_compressed_object_streams_count_at_258_a_page_on_gemini_2(self, serve_guard):
        """1,000 pages whose page objects sit in object streams, in a 12 KB-class file."""
        guard = await serve_guard()
        packed, plain = pdf(1000, object_streams=True), pdf(1000, object_streams=False)
        assert b"/ObjStm" in packed and b"/ObjStm" not in plain
        counted = await count(guard, FLASH, "application/pdf", packed)
        assert 258_000 <= counted <= 258_000 + PROMPT_SLACK
        assert await count(guard, FLASH, "application/pdf", plain) == counted  # the control

    async def test_a_page_costs_the_default_pdf_resolution_on_gemini_3(self, serve_guard):
        guard = await serve_guard()
        counted = await count(guard, GEMINI_3, "application/pdf", pdf(40, object_streams=True))
        assert 40 * 560 <= counted <= 40 * 560 + PROMPT_SLACK

    async def test_a_thousand_page_pdf_fits_a_million_token_model(self, serve_guard):
        """258,000 tokens, as Google counts it: forwarded, not refused as 4 million."""
        guard = await serve_guard()
        body = {"contents": [{"role": "user", "parts": [
            {"inlineData": {"mimeType": "application/pdf", "data": b64(pdf(1000, object_streams=False))}},
            {"text": "Summarise it."},
        ]}]}  # fmt: skip
        status, answer, _ = await post(guard.url(f"/v1beta/models/{FLASH}:generateContent"), json.dumps(body).encode())
        assert status != 400, answer[:300]


    async def test_a_file_that_is_not_a_pdf_is_counted_by_its_text_not_as_pages(self, serve_guard):
        """A plain-text file sent inline: never one 258-token page, whatever its size."""
        guard = await serve_guard()
        text = ("The quick brown fox jumps over the lazy dog. " * 8000).encode()
        assert await count(guard, FLASH, "text/plain", text) >= len(text) // 4


class TestVideoLength:
    @pytest.mark.parametrize(
        ("container", "codec", "sound"), [("mp4", "libx264", "aac"), ("mov", "libx264", "aac"), ("webm", "libvpx", "libopus")]
    )
    async def test_a_video_counts_its_containers_duration_at_the_published_rate(self, serve_guard, container, codec, sound):
        guard = await serve_guard()
        counted = await count(guard, FLASH, f"video/{'quicktime' if container == 'mov' else container}", video(container, codec, 60, sound))
        assert 60 * (258 + 32) <= counted <= 60 * VIDEO_RATE + PROMPT_SLACK

    async def test_an_hour_of_one_frame_a_second_h264_is_counted_as_an_hour(self, serve_guard):
        """About 100 KB of H.264 that plays an hour: Google counts ~300 tokens a second of it."""
        guard = await serve_guard()
        clip = video("mp4", "libx264", 3600)
        assert len(clip) < 200_000
        counted = await count(guard, FLASH, "video/mp4", clip)
        assert 3600 * (258 + 32) <= counted <= 3600 * VIDEO_RATE + PROMPT_SLACK

    async def test_a_part_that_asks_more_frames_a_second_costs_them(self, serve_guard):
        guard = await serve_guard()
        clip = video("mp4", "libx264", 20)
        one = await count(guard, FLASH, "video/mp4", clip)
        five = await count(guard, FLASH, "video/mp4", clip, videoMetadata={"fps": 5})
        assert five - one == 20 * 4 * 258


class TestAudioLength:
    async def test_a_wav_with_a_junk_chunk_before_its_format_counts_its_length(self, serve_guard):
        """600 s of PCM: 19,200 tokens, whether or not a `JUNK` chunk comes first (the control)."""
        guard = await serve_guard()
        wav = audio("wav", "pcm_s16le", 600)
        plain = await count(guard, FLASH, "audio/wav", wav)
        padded = await count(guard, FLASH, "audio/wav", with_junk_before_format(wav))
        assert 19_200 <= plain <= 19_200 + PROMPT_SLACK and padded == plain

    @pytest.mark.parametrize(
        ("container", "codec", "mime", "rate"),
        [
            ("mp3", "libmp3lame", "audio/mp3", 16_000),
            ("flac", "flac", "audio/flac", 16_000),
            ("ogg", "libopus", "audio/ogg", 48_000),
            ("adts", "aac", "audio/aac", 16_000),
            ("ipod", "aac", "audio/mp4", 16_000),  # M4A: AAC in an MP4 container
            ("webm", "libopus", "audio/webm", 48_000),
        ],
    )
    async def test_compressed_audio_counts_its_length_at_32_a_second(self, serve_guard, container, codec, mime, rate):
        guard = await serve_guard()
        counted = await count(guard, FLASH, mime, audio(container, codec, 125, rate))
        assert 125 * 32 <= counted <= math.ceil(125.2 * 32) + PROMPT_SLACK


class TestImageSize:
    async def test_a_forged_header_claiming_a_huge_png_costs_at_most_sixteen_tiles(self, serve_guard):
        guard = await serve_guard()
        forged = await count(guard, FLASH, "image/png", png_header(2**31 - 1, 2**31 - 1))
        real = await count(guard, FLASH, "image/png", png_header(300, 200))  # the control: one tile
        assert 258 <= real <= 258 + PROMPT_SLACK
        assert forged - real == 15 * 258  # fitted in 3072 x 3072: 4 x 4 tiles, as Gemini scales it

    async def test_on_gemini_3_it_costs_the_resolutions_figure(self, serve_guard):
        guard = await serve_guard()
        forged = await count(guard, GEMINI_3, "image/png", png_header(2**31 - 1, 2**31 - 1))
        assert 1120 <= forged <= 1120 + PROMPT_SLACK


class TestTheLocalTokenizer:
    def test_google_genai_counts_no_media_locally(self):
        """Its `LocalTokenizer` gathers the texts it counts with this accumulator (without loading
        its vocabulary), which refuses any inline or file part: it is no reference for media."""
        part = types.Part.from_bytes(data=pdf(1, object_streams=False), mime_type="application/pdf")
        with pytest.raises(ValueError, match="non-text"):
            _TextsAccumulator().add_contents([types.Content(role="user", parts=[part])])
