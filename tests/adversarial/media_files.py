"""Media files made by real encoders, in memory, for the media-rate tests: PDFs written by qpdf
(pikepdf), with or without object streams; video and audio written by FFmpeg's muxers and encoders
(PyAV's wheels carry them): H.264 in MP4 and MOV, VP8 in WebM, AAC and Opus sound, PCM WAV, MP3
(LAME), AAC (ADTS, M4A), FLAC, Opus in Ogg."""

from __future__ import annotations

import base64
import io
import struct
from fractions import Fraction

import av
import numpy as np
import pikepdf

AUDIO_RATE = 48_000


def pdf(pages: int, object_streams: bool) -> bytes:
    """A PDF of `pages` blank Letter pages; with `object_streams`, every page object is in a
    Flate-compressed object stream and the cross-reference table is a compressed stream too."""
    document = pikepdf.new()
    for _ in range(pages):
        document.add_blank_page(page_size=(612, 792))
    out = io.BytesIO()
    mode = pikepdf.ObjectStreamMode.generate if object_streams else pikepdf.ObjectStreamMode.disable
    document.save(out, object_stream_mode=mode, compress_streams=True)
    return out.getvalue()


def video(container: str, codec: str, seconds: int, sound: str | None = None) -> bytes:
    """`seconds` of black 64x48 video at 1 frame a second, with `sound` (an audio codec) of silence."""
    out = io.BytesIO()
    with av.open(out, "w", format=container) as muxer:
        picture = muxer.add_stream(codec, rate=1)
        picture.width, picture.height, picture.pix_fmt = 64, 48, "yuv420p"
        audio = muxer.add_stream(sound, rate=AUDIO_RATE) if sound else None
        for second in range(seconds):
            frame = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")
            frame.pts, frame.time_base = second, Fraction(1, 1)
            for packet in picture.encode(frame):
                muxer.mux(packet)
        for packet in picture.encode():
            muxer.mux(packet)
        if audio is not None:
            _silence(muxer, audio, seconds, AUDIO_RATE)
    return out.getvalue()


def audio(container: str, codec: str, seconds: int, rate: int = 16_000) -> bytes:
    """`seconds` of mono silence encoded by `codec` in `container`."""
    out = io.BytesIO()
    with av.open(out, "w", format=container) as muxer:
        stream = muxer.add_stream(codec, rate=rate)
        stream.layout = "mono"
        _silence(muxer, stream, seconds, rate)
    return out.getvalue()


def _silence(muxer: av.container.OutputContainer, stream: av.AudioStream, seconds: int, rate: int) -> None:
    size = stream.codec_context.frame_size or 1024
    sample_format = stream.codec_context.format.name
    kind = np.float32 if sample_format.startswith("flt") else np.int32 if sample_format.startswith("s32") else np.int16
    at = 0
    while at < seconds * rate:
        frame = av.AudioFrame.from_ndarray(np.zeros((1, size), kind), format=sample_format, layout="mono")
        frame.sample_rate, frame.pts = rate, at
        for packet in stream.encode(frame):
            muxer.mux(packet)
        at += size
    for packet in stream.encode():
        muxer.mux(packet)


def with_junk_before_format(wav: bytes, junk: int = 4096) -> bytes:
    """A WAV with a `JUNK` chunk (legal, skipped by every reader) between `WAVE` and `fmt `."""
    inserted = b"JUNK" + struct.pack("<I", junk) + bytes(junk)
    body = wav[12:]
    return b"RIFF" + struct.pack("<I", 4 + len(inserted) + len(body)) + b"WAVE" + inserted + body


def png_header(width: int, height: int) -> bytes:
    """The 33 bytes of a PNG's signature and IHDR chunk claiming `width` x `height` (no pixels)."""
    ihdr = struct.pack(">II5B", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + b"\x00\x00\x00\x00"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()
