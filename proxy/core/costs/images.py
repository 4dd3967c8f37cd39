"""What an image costs in tokens, from its size alone.

Sizes come from the image header inside a `data:` URL (PNG, JPEG, GIF, WebP); no pixel is
decoded and no remote URL is ever fetched. A remote or unreadable image is priced at the most
that its detail level can cost, and the result says so.

Cost schemes, one per way the providers price images:
- `TileCost`: OpenAI's tile formula (fit in 2048x2048, shortest side to 768, 512 px tiles);
- `PatchCost`: OpenAI's patch formula for gpt-4.1-mini/nano, o4-mini and gpt-5-mini/nano;
- `AreaCost`: width x height / 750 after fitting the long side (Anthropic's published rule);
- `FixedTileCost`: a fixed cost per tile of a fixed size (Gemini 2.x: 258 per 768 px tile);
- `ResolutionCost`: a fixed cost per image by the media resolution asked (Gemini 3).
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from dataclasses import dataclass
from typing import Protocol

from proxy.core.work_budget import spend

# Enough base64 to reach the size fields of PNG, GIF and WebP headers, and the SOF marker of
# most JPEGs; a JPEG whose EXIF block pushes SOF further is decoded in full.
_HEADER_B64_CHARS = 64 * 1024


@dataclass(frozen=True, slots=True)
class ImageCost:
    tokens: int
    width: int | None
    height: int | None
    estimated: bool  # True when the size was unknown and the maximum was assumed


class ImageCostScheme(Protocol):
    def cost(self, width: int, height: int, detail: str) -> int: ...

    def max_cost(self, detail: str) -> int: ...

    def page_cost(self, detail: str) -> int | None:
        """What the provider documents a document page to cost, its text included; None where it
        shows a page as an image and its text besides (`proxy.core.costs.media.file_cost`)."""
        ...

    def frame_cost(self, detail: str) -> int:
        """What one frame of a video costs (`proxy.core.costs.media.video_cost`)."""
        ...


class _ImagePages:
    """A page shown as the largest image and its text; a frame as the largest image (the providers
    that price this way take no video)."""

    __slots__ = ()

    def max_cost(self, detail: str) -> int:
        raise NotImplementedError

    def page_cost(self, detail: str) -> int | None:
        return None

    def frame_cost(self, detail: str) -> int:
        return self.max_cost(detail)


@dataclass(frozen=True, slots=True)
class TileCost(_ImagePages):
    base: int
    per_tile: int
    tile: int = 512
    fit: int = 2048
    short_side: int = 768

    def cost(self, width: int, height: int, detail: str) -> int:
        if detail == "low":
            return self.base
        w, h = float(width), float(height)
        if max(w, h) > self.fit:
            scale = self.fit / max(w, h)
            w, h = w * scale, h * scale
        if min(w, h) > self.short_side:
            scale = self.short_side / min(w, h)
            w, h = w * scale, h * scale
        tiles = math.ceil(int(w) / self.tile) * math.ceil(int(h) / self.tile)
        return self.base + self.per_tile * max(tiles, 1)

    def max_cost(self, detail: str) -> int:
        if detail == "low":
            return self.base
        # Shortest side at most `short_side`, longest at most `fit`.
        return self.base + self.per_tile * math.ceil(self.short_side / self.tile) * math.ceil(self.fit / self.tile)


@dataclass(frozen=True, slots=True)
class PatchCost(_ImagePages):
    multiplier: float
    patch: int = 32
    max_patches: int = 1536
    # Tokens around each image besides its patches: gpt-4.1-nano's one API-recorded image (540x360,
    # 204 patches) cost 503, ceil(204 x 2.46) + 1. The other patch models show none that was measured.
    per_image: int = 0

    def _patches(self, width: int, height: int) -> int:
        raw = math.ceil(width / self.patch) * math.ceil(height / self.patch)
        if raw <= self.max_patches:
            return raw
        shrink = math.sqrt(self.patch**2 * self.max_patches / (width * height))
        shrink *= min(
            math.floor(width * shrink / self.patch) / (width * shrink / self.patch),
            math.floor(height * shrink / self.patch) / (height * shrink / self.patch),
        )
        patches = math.ceil(int(width * shrink) / self.patch) * math.ceil(int(height * shrink) / self.patch)
        return min(patches, self.max_patches)

    def cost(self, width: int, height: int, detail: str) -> int:
        # The patch models do not document a cheaper `low` detail, so none is assumed.
        return math.ceil(self._patches(width, height) * self.multiplier) + self.per_image

    def max_cost(self, detail: str) -> int:
        return math.ceil(self.max_patches * self.multiplier) + self.per_image


@dataclass(frozen=True, slots=True)
class AreaCost(_ImagePages):
    pixels_per_token: int = 750
    max_long_side: int = 1568
    max_tokens: int = 1600

    def cost(self, width: int, height: int, detail: str) -> int:
        w, h = float(width), float(height)
        if max(w, h) > self.max_long_side:
            scale = self.max_long_side / max(w, h)
            w, h = w * scale, h * scale
        return min(self.max_tokens, math.ceil(w * h / self.pixels_per_token))

    def max_cost(self, detail: str) -> int:
        return self.max_tokens


@dataclass(frozen=True, slots=True)
class FixedTileCost:
    """Gemini 2.x: an image of both sides at most `small_side` is one tile; a larger one is scaled
    down to fit `fit` x `fit` (3072: https://ai.google.dev/gemini-api/docs/image-understanding and
    Vertex AI's "Image understanding": "larger images are scaled down ... to fit a maximum
    resolution of 3072x3072") and cut into tiles of `tile` px, each `per_tile` tokens (at most 16,
    whatever size its header claims). A document page costs `per_tile` ("Each document page is
    equivalent to 258 tokens": https://ai.google.dev/gemini-api/docs/document-processing), a video
    frame `per_tile` (66 at a low media resolution: https://ai.google.dev/gemini-api/docs/video-understanding,
    "Technical details")."""

    per_tile: int = 258
    tile: int = 768
    small_side: int = 384
    fit: int = 3072
    low_frame: int = 66

    def cost(self, width: int, height: int, detail: str) -> int:
        if width <= self.small_side and height <= self.small_side:
            return self.per_tile
        scale = min(1.0, self.fit / max(width, height))
        tiles = math.ceil(width * scale / self.tile) * math.ceil(height * scale / self.tile)
        return self.per_tile * min(max(tiles, 1), self._most_tiles)

    @property
    def _most_tiles(self) -> int:
        return math.ceil(self.fit / self.tile) ** 2

    def max_cost(self, detail: str) -> int:
        return self.per_tile * self._most_tiles

    def page_cost(self, detail: str) -> int | None:
        return self.per_tile

    def frame_cost(self, detail: str) -> int:
        return self.low_frame if detail == "MEDIA_RESOLUTION_LOW" else self.per_tile


# Gemini 3's tokens per image at each `mediaResolution` level, whatever the image's size
# (https://ai.google.dev/gemini-api/docs/media-resolution, section "Token counts"; the figures
# as summarized at https://fastgptplus.com/en/posts/gemini-3-pro-media-resolution-parameter):
# LOW 280, MEDIUM 560, HIGH 1120, ULTRA_HIGH 2240 (per part only); none or UNSPECIFIED is HIGH.
GEMINI3_IMAGE_TOKENS: dict[str, int] = {
    "MEDIA_RESOLUTION_LOW": 280,
    "MEDIA_RESOLUTION_MEDIUM": 560,
    "MEDIA_RESOLUTION_HIGH": 1120,
    "MEDIA_RESOLUTION_ULTRA_HIGH": 2240,
}
_GEMINI3_MOST = max(GEMINI3_IMAGE_TOKENS.values())  # a level the table does not know
# Gemini 3's tokens per video frame by level (same page, "Token counts": low and medium 70, high
# 280); with no level asked, or one the table does not know, the most (the default is the
# provider's: never counted under it).
GEMINI3_FRAME_TOKENS: dict[str, int] = {
    "MEDIA_RESOLUTION_LOW": 70,
    "MEDIA_RESOLUTION_MEDIUM": 70,
    "MEDIA_RESOLUTION_HIGH": 280,
}
# A PDF page is read at MEDIUM (560) unless another level is asked (same page, "Token counts":
# the default for PDFs).
GEMINI3_PDF_DEFAULT = "MEDIA_RESOLUTION_MEDIUM"


def is_media_resolution(detail: object) -> bool:
    """A Gemini media resolution as a `detail`: a level, or `LEVEL|N` for a part that also asks
    for N tokens (`numTokens`); a level the table does not know too (it is priced at the most)."""
    return isinstance(detail, str) and detail.startswith("MEDIA_RESOLUTION_")


@dataclass(frozen=True, slots=True)
class ResolutionCost:
    """The `detail` is the media resolution asked (`MEDIA_RESOLUTION_*`); `high`, `auto`, `low`
    (no level asked) and UNSPECIFIED are the default, a level not in the table the most there is.
    `LEVEL|N` (a part's `numTokens`) costs the larger of the level's and N."""

    default: str = "MEDIA_RESOLUTION_HIGH"

    def cost(self, width: int, height: int, detail: str) -> int:
        return self.max_cost(detail)

    def max_cost(self, detail: str) -> int:
        detail, _, asked = detail.partition("|")
        if detail in ("high", "auto", "low", "MEDIA_RESOLUTION_UNSPECIFIED"):
            detail = self.default
        level = GEMINI3_IMAGE_TOKENS.get(detail, _GEMINI3_MOST)
        return max(level, int(asked)) if asked.isdigit() else level

    def page_cost(self, detail: str) -> int | None:
        level = detail.partition("|")[0]
        asked = level if level.startswith("MEDIA_RESOLUTION_") and level != "MEDIA_RESOLUTION_UNSPECIFIED" else None
        return self.max_cost(detail if asked is not None else GEMINI3_PDF_DEFAULT)

    def frame_cost(self, detail: str) -> int:
        level, _, asked = detail.partition("|")
        tokens = GEMINI3_FRAME_TOKENS.get(level, max(GEMINI3_FRAME_TOKENS.values()))
        return max(tokens, int(asked)) if asked.isdigit() else tokens


# Anthropic refuses an image with a side over 8,000 px ("Images larger than 8000x8000 px will be
# rejected": https://docs.claude.com/en/docs/build-with-claude/vision, "Evaluate image size").
ANTHROPIC_IMAGE_SIDE_MOST = 8000


def side_over(url: str, most: int) -> tuple[int, int] | None:
    """The size of a `data:` URL image with a side over `most` px (as its header states it), else
    None: the image a provider with that limit refuses."""
    size = data_url_image_size(url) if url.startswith("data:") else None
    return size if size is not None and max(size) > most else None


def image_cost(url: str, detail: str, scheme: ImageCostScheme) -> ImageCost:
    """Price one `image_url` part. Unknown sizes are priced at the scheme's maximum."""
    size = data_url_image_size(url) if url.startswith("data:") else None
    if size is None:
        return ImageCost(scheme.max_cost(detail), None, None, estimated=True)
    width, height = size
    return ImageCost(scheme.cost(width, height, detail), width, height, estimated=False)


def data_url_image_size(url: str) -> tuple[int, int] | None:
    """(width, height) from the header of a base64 `data:` URL, or None when it cannot be read."""
    comma = url.find(",")
    if comma < 0 or ";base64" not in url[:comma]:
        return None
    payload = url[comma + 1 :]
    head = _b64_prefix(payload, _HEADER_B64_CHARS)
    if head is None:
        return None
    size = image_size(head)
    if size is None and head[:2] == b"\xff\xd8" and len(payload) > _HEADER_B64_CHARS:
        spend(len(payload))  # a JPEG whose size comes late: the whole image decoded
        whole = _b64_prefix(payload, len(payload))
        size = image_size(whole) if whole is not None else None
    return size


def _b64_prefix(payload: str, chars: int) -> bytes | None:
    chunk = payload[:chars].strip()
    chunk = chunk[: len(chunk) - len(chunk) % 4]
    try:
        return base64.b64decode(chunk, validate=False)
    except (binascii.Error, ValueError):
        return None


def image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) from the first bytes of a PNG, GIF, WebP or JPEG file."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        w, h = struct.unpack(">II", data[16:24])
        return _positive(w, h)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        w, h = struct.unpack("<HH", data[6:10])
        return _positive(w, h)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp_size(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def _positive(w: int, h: int) -> tuple[int, int] | None:
    return (w, h) if w > 0 and h > 0 else None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    kind = data[12:16]
    if kind == b"VP8X" and len(data) >= 30:
        w = int.from_bytes(data[24:27], "little") + 1
        h = int.from_bytes(data[27:30], "little") + 1
        return _positive(w, h)
    if kind == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        w, h = struct.unpack("<HH", data[26:30])
        return _positive(w & 0x3FFF, h & 0x3FFF)
    if kind == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        bits = int.from_bytes(data[21:25], "little")
        return _positive((bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    return None


# Start-of-frame markers carry the size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but do not.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    n = len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers with no length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in _JPEG_SOF:
            if i + 9 > n:
                return None
            h, w = struct.unpack(">HH", data[i + 5 : i + 9])
            return _positive(w, h)
        i += 2 + length
    return None
