"""Image costs from header sizes, by the providers' published formulas."""

from __future__ import annotations

import base64
import struct

import pytest

from proxy.core.costs.images import (
    AreaCost,
    PatchCost,
    ResolutionCost,
    TileCost,
    data_url_image_size,
    image_cost,
    image_size,
)
from tests.conftest import png_data_url

GPT4O = TileCost(85, 170)


class TestTileFormula:
    @pytest.mark.parametrize(
        ("width", "height", "detail", "tokens"),
        [(1024, 1024, "high", 765), (2048, 4096, "high", 1105), (4096, 8192, "low", 85), (512, 512, "high", 255)],
    )
    def test_matches_openais_documented_examples(self, width, height, detail, tokens):
        assert GPT4O.cost(width, height, detail) == tokens

    def test_gpt_4o_mini_uses_its_own_base_and_tile_costs(self):
        assert TileCost(2833, 5667).cost(1024, 1024, "high") == 2833 + 4 * 5667

    def test_the_maximum_is_eight_tiles(self):
        assert GPT4O.max_cost("high") == 85 + 8 * 170
        assert max(
            GPT4O.cost(w, h, "high") for w in range(64, 5000, 97) for h in range(64, 5000, 89)
        ) <= GPT4O.max_cost("high")


class TestPatchFormula:
    def test_small_images_cost_their_patches_times_the_multiplier(self):
        assert PatchCost(1.62).cost(1024, 1024, "high") == round(1024 * 1.62 + 0.5)  # 1024 patches

    def test_large_images_are_scaled_under_the_patch_cap(self):
        # OpenAI's example: 1800x2400 scales to 1056x1408, 33x44 = 1452 patches.
        assert PatchCost(1.0).cost(1800, 2400, "high") == 1452

    def test_never_exceeds_the_cap(self):
        assert PatchCost(2.46).cost(10000, 10000, "high") <= PatchCost(2.46).max_cost("high")

    def test_gpt_4_1_nano_adds_one_token_per_image_as_the_api_recorded(self):
        # pydantic-ai's test_image_url_input_force_download: a 540x360 JPEG, 204 patches, 503 tokens.
        assert PatchCost(2.46, per_image=1).cost(540, 360, "auto") == 503

    def test_the_per_image_tokens_are_part_of_the_largest_cost(self):
        assert PatchCost(2.46, per_image=1).max_cost("high") == PatchCost(2.46).max_cost("high") + 1


class TestAreaFormula:
    def test_is_pixels_over_750_capped(self):
        assert AreaCost().cost(1000, 1000, "auto") == 1334
        assert AreaCost().cost(8000, 8000, "auto") == 1600


def _gif(w: int, h: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", w, h) + b"\0" * 8


def _webp_vp8x(w: int, h: int) -> bytes:
    return b"RIFF" + b"\0" * 4 + b"WEBPVP8X" + b"\0" * 8 + (w - 1).to_bytes(3, "little") + (h - 1).to_bytes(3, "little")


def _webp_vp8(w: int, h: int) -> bytes:
    return b"RIFF" + b"\0" * 4 + b"WEBPVP8 " + b"\0" * 4 + b"\0\0\0" + b"\x9d\x01\x2a" + struct.pack("<HH", w, h)


def _webp_vp8l(w: int, h: int) -> bytes:
    bits = (w - 1) | ((h - 1) << 14)
    return b"RIFF" + b"\0" * 4 + b"WEBPVP8L" + b"\0" * 4 + b"\x2f" + bits.to_bytes(4, "little")


def _jpeg(w: int, h: int, app_bytes: int = 16) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", app_bytes + 2) + b"\0" * app_bytes
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, h, w, 3) + b"\0" * 9
    return b"\xff\xd8" + app0 + b"\xff\xc4\x00\x04\x00\x00" + sof0


class TestHeaders:
    @pytest.mark.parametrize(
        "data",
        [_gif(640, 480), _webp_vp8x(640, 480), _webp_vp8(640, 480), _webp_vp8l(640, 480), _jpeg(640, 480)],
        ids=["gif", "webp-vp8x", "webp-vp8", "webp-vp8l", "jpeg"],
    )
    def test_reads_width_and_height_without_decoding_pixels(self, data):
        assert image_size(data) == (640, 480)

    def test_reads_png_from_a_data_url(self):
        assert data_url_image_size(png_data_url(1920, 1080)) == (1920, 1080)

    def test_finds_a_jpeg_size_past_a_large_exif_block(self):
        url = "data:image/jpeg;base64," + base64.b64encode(_jpeg(3000, 2000, app_bytes=60000) + b"\0" * 100).decode()
        assert data_url_image_size(url) == (3000, 2000)

    def test_garbage_is_unknown_not_an_error(self):
        assert data_url_image_size("data:image/png;base64,!!!notbase64") is None
        assert image_size(b"hello") is None


class TestUnknownSizes:
    def test_a_remote_url_is_priced_at_the_maximum_and_flagged(self):
        cost = image_cost("https://example.com/cat.png", "high", GPT4O)
        assert cost.tokens == GPT4O.max_cost("high") and cost.estimated

    def test_a_remote_low_detail_image_costs_the_base(self):
        assert image_cost("https://example.com/cat.png", "low", GPT4O).tokens == 85

    def test_a_1920x1080_screenshot_costs_far_more_than_a_flat_85(self):
        assert image_cost(png_data_url(1920, 1080), "high", GPT4O).tokens == 1105


class TestGemini3Resolution:
    """Gemini 3 prices an image by the media resolution asked, not by its size (Google's
    "Media resolution" page, section "Token counts")."""

    @pytest.mark.parametrize(
        ("level", "tokens"),
        [
            ("MEDIA_RESOLUTION_LOW", 280),
            ("MEDIA_RESOLUTION_MEDIUM", 560),
            ("MEDIA_RESOLUTION_HIGH", 1120),
            ("MEDIA_RESOLUTION_ULTRA_HIGH", 2240),
        ],
    )
    def test_each_level_costs_its_documented_tokens_whatever_the_size(self, level: str, tokens: int) -> None:
        assert ResolutionCost().cost(64, 64, level) == tokens
        assert ResolutionCost().cost(4000, 3000, level) == tokens
        assert image_cost("https://example.com/a.png", level, ResolutionCost()).tokens == tokens

    @pytest.mark.parametrize("detail", ["high", "auto", "low", "MEDIA_RESOLUTION_UNSPECIFIED"])
    def test_no_level_asked_is_the_default_high(self, detail: str) -> None:
        assert ResolutionCost().cost(100, 100, detail) == 1120

    def test_a_level_it_does_not_know_costs_the_most_there_is(self) -> None:
        assert ResolutionCost().cost(100, 100, "MEDIA_RESOLUTION_EXTREME") == 2240

    def test_a_number_of_tokens_asked_beside_the_level_counts_when_it_is_more(self) -> None:
        assert ResolutionCost().cost(100, 100, "MEDIA_RESOLUTION_LOW|4000") == 4000
        assert ResolutionCost().cost(100, 100, "MEDIA_RESOLUTION_HIGH|100") == 1120
