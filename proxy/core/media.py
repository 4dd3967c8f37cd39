"""What audio and file parts of a message cost: no provider publishes a rule, so both are
bounded from above, and say so.

- **Audio** (`input_audio`): Gemini documents 32 tokens per second, the highest published rate;
  the length is read from a WAV header, and audio of another format is assumed to be 16 kbit/s,
  a lower rate than any common codec, so that its length is overestimated.
- **Files** (`file` with `file_data`): providers show each page as extracted text and as an
  image, so a page costs the model's largest image and the text at most a token per 3 bytes.
  A file sent by `file_id` is not visible to the guard and is not counted (the note says so).

Each function returns (text tokens, media tokens, notes), as a content part's count does.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from collections.abc import Mapping
from typing import Any

from proxy.core.images import ImageCostScheme

AUDIO_TOKENS_PER_SECOND = 32
AUDIO_ASSUMED_BYTES_PER_SECOND = 2000


def audio_cost(part: Mapping[str, Any]) -> tuple[int, int, list[str]]:
    spec = part.get("input_audio")
    data = spec.get("data") if isinstance(spec, Mapping) else None
    if not isinstance(data, str):
        return 0, 0, ["audio part without data; not counted"]
    seconds = _wav_seconds(data) if isinstance(spec, Mapping) and spec.get("format") == "wav" else None
    estimated = seconds is None
    if seconds is None:
        seconds = len(data) * 3 / 4 / AUDIO_ASSUMED_BYTES_PER_SECOND
    tokens = math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)
    # No OpenAI audio rate is published: even a measured duration gives an estimate.
    note = [f"audio length estimated from its size ({seconds:.1f} s)"] if estimated else []
    note.append(f"audio priced at {AUDIO_TOKENS_PER_SECOND} tokens/s, the highest published rate")
    return 0, tokens, note


def file_cost(part: Mapping[str, Any], images: ImageCostScheme) -> tuple[int, int, list[str]]:
    spec = part.get("file")
    if not isinstance(spec, Mapping):
        return 0, 0, ["file part without a file; not counted"]
    data = spec.get("file_data")
    if not isinstance(data, str):
        return 0, 0, ["file sent by file_id: its content is not visible to the guard and is not counted"]
    raw = _b64_decode(data.split(",", 1)[1] if data.startswith("data:") else data)
    pages = max(
        1,
        raw.count(b"/Type /Page") - raw.count(b"/Type /Pages") + raw.count(b"/Type/Page") - raw.count(b"/Type/Pages"),
    )
    tokens = pages * images.max_cost("high") + math.ceil(len(raw) / 3)
    return 0, tokens, [f"file of {pages} page(s) estimated at {tokens} tokens"]


def _b64_decode(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return data.encode("utf-8", "replace")


def _wav_seconds(data: str) -> float | None:
    head = _b64_decode(data[:64])
    if len(head) < 44 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    byte_rate = int(struct.unpack("<I", head[28:32])[0])
    if byte_rate <= 0:
        return None
    return max(0.0, len(data) * 3 / 4 - 44) / byte_rate
