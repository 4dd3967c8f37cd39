"""How long a piece of audio or video plays, read from its format's own structure, as its decoder
or demuxer reads it.

**Audio:**

    WAV    the RIFF chunks walked (`JUNK`, `LIST`, `bext`... skipped) to `fmt ` and `data`: the
           data's bytes (as stated, or as far as the file goes when it says more or nothing) at
           the slower of the stated byte rate and the one the sample rate, channels and sample
           size give
    MP3    every MPEG audio frame walked (after an ID3v2 tag): its samples at its sample rate
    AAC    every ADTS frame walked: 1,024 samples a raw block at its (core) sample rate
    FLAC   STREAMINFO's total samples at its sample rate
    Ogg    the largest granule position of any page (Vorbis, Opus: less its pre-skip, FLAC,
           Speex), at the stream's rate from its first packet

`audio_seconds` gives (seconds, proven); proven is False for a format it does not read or a
structure it cannot follow, and the caller then bounds the length otherwise. What an MP3 walk
cannot frame past its start (a damaged stretch) is counted at the lowest bitrate MPEG audio has
(8 kbit/s), which no decoder can play longer, and is not proven.

**Video**, from its container:

    MP4, MOV     the boxes walked (ISO/IEC 14496-12): the movie header's duration (`mvhd`), each
                 track's (`mdhd`), the fragmented movie's (`mehd`), each track's samples' own
                 durations (`stts`) and those of every movie fragment (`moof`: `trun`, with the
                 defaults of `tfhd` and `trex`), each in its own timescale; the longest
    WebM, MKV    the EBML elements walked (Matroska): the segment's `Duration` and the time of
                 every block (its cluster's `Timecode` plus its own, and its `BlockDuration`), in
                 `TimecodeScale` nanoseconds; the longest

The longest of what a file states is taken, so a header that says less than the samples do does
not shorten it. `video_seconds` gives (seconds, proven); proven is False for a container not read
here or a structure that cannot be followed, and the caller then bounds the length otherwise.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

MP3_FRAMES_READ = 600_000  # MP3 or AAC frames walked at most (a 10 h MP3 at 44.1 kHz has 470,000)
OGG_PAGES_READ = 400_000
RIFF_CHUNKS_READ = 10_000
_LOWEST_BYTES_PER_SECOND = 1000  # 8 kbit/s: MPEG-2 layer III's lowest bitrate

_MP3_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_MP3_KBPS = {
    (3, 3): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),  # MPEG-1 layer I
    (3, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),  # MPEG-1 layer II
    (3, 1): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),  # MPEG-1 layer III
    (2, 3): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),  # MPEG-2/2.5 layer I
    (2, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),  # MPEG-2/2.5 layers II, III
}


def audio_seconds(raw: bytes) -> tuple[float, bool]:
    """(seconds, proven) of audio file `raw`; (0.0, False) for a format not read here."""
    if raw[:4] == b"RIFF" and raw[8:12] == b"WAVE":
        return _wav(raw)
    if raw[:4] == b"OggS":
        return _ogg(raw)
    start = _after_id3(raw)
    if raw[start : start + 4] == b"fLaC":
        return _flac(raw, start + 4)
    if _mp3_frame(raw, start) is not None:
        return _frames(raw, start, _mp3_frame)
    if _adts_frame(raw, start) is not None:
        return _frames(raw, start, _adts_frame)
    return 0.0, False


def _wav(raw: bytes) -> tuple[float, bool]:
    at, rates = 12, None
    for _ in range(RIFF_CHUNKS_READ):
        if at + 8 > len(raw):
            break
        kind, size = raw[at : at + 4], struct.unpack_from("<I", raw, at + 4)[0]
        if kind == b"fmt " and size >= 16 and at + 24 <= len(raw):
            channels, sample_rate, stated = struct.unpack_from("<HII", raw, at + 10)
            (bits,) = struct.unpack_from("<H", raw, at + 22)
            rates = [r for r in (stated, sample_rate * channels * bits // 8) if r > 0]
        elif kind == b"data":
            if not rates:
                return 0.0, False  # samples before their format: no decoder plays them
            available = len(raw) - (at + 8)
            played = size if 0 < size <= available else available
            return played / min(rates), True
        at += 8 + size + (size & 1)  # chunks are padded to an even length
    return 0.0, False


def _after_id3(raw: bytes) -> int:
    """Where the audio starts after an ID3v2 tag (its size is four 7-bit bytes), else 0."""
    if raw[:3] != b"ID3" or len(raw) < 10:
        return 0
    size = (raw[6] & 0x7F) << 21 | (raw[7] & 0x7F) << 14 | (raw[8] & 0x7F) << 7 | (raw[9] & 0x7F)
    return 10 + size + (10 if raw[5] & 0x10 else 0)


def _mp3_frame(raw: bytes, at: int) -> tuple[int, int, int] | None:
    """(frame bytes, samples, sample rate) of the MPEG audio frame header at `at`, or None."""
    if at + 4 > len(raw) or raw[at] != 0xFF or raw[at + 1] & 0xE0 != 0xE0:
        return None
    version, layer = (raw[at + 1] >> 3) & 3, (raw[at + 1] >> 1) & 3
    bitrate_index, rate_index, padding = raw[at + 2] >> 4, (raw[at + 2] >> 2) & 3, (raw[at + 2] >> 1) & 1
    if version == 1 or layer == 0 or bitrate_index in (0, 15) or rate_index == 3:
        return None  # reserved values, or free format (no length in its header)
    kbps = _MP3_KBPS[(3, layer) if version == 3 else (2, 3 if layer == 3 else 2)][bitrate_index]
    rate = _MP3_RATES[version][rate_index]
    if layer == 3:  # layer I: slots of four bytes
        return (12 * kbps * 1000 // rate + padding) * 4, 384, rate
    samples = 1152 if layer == 2 or version == 3 else 576
    return samples // 8 * kbps * 1000 // rate + padding, samples, rate


_ADTS_RATES = (96000, 88200, 64000, 48000, 44100, 32000, 24000, 22050, 16000, 12000, 11025, 8000, 7350)


def _adts_frame(raw: bytes, at: int) -> tuple[int, int, int] | None:
    """(frame bytes, samples, sample rate) of the ADTS (AAC) frame header at `at`, or None."""
    if at + 7 > len(raw) or raw[at] != 0xFF or raw[at + 1] & 0xF6 != 0xF0:  # sync, layer 0
        return None
    rate_index = (raw[at + 2] >> 2) & 0xF
    size = (raw[at + 3] & 3) << 11 | raw[at + 4] << 3 | raw[at + 5] >> 5
    if rate_index >= len(_ADTS_RATES) or size < 7:
        return None
    return size, 1024 * ((raw[at + 6] & 3) + 1), _ADTS_RATES[rate_index]


def _frames(raw: bytes, at: int, frame_at: Callable[[bytes, int], tuple[int, int, int] | None]) -> tuple[float, bool]:
    seconds = 0.0
    for _ in range(MP3_FRAMES_READ):
        frame = frame_at(raw, at)
        if frame is None:
            break
        size, samples, rate = frame
        seconds += samples / rate
        at += size
    rest = len(raw) - at
    if rest <= 0 or (rest == 128 and raw[at : at + 3] == b"TAG"):  # the end, or an ID3v1 tag
        return seconds, True
    return seconds + rest / _LOWEST_BYTES_PER_SECOND, False


def _flac(raw: bytes, at: int) -> tuple[float, bool]:
    if at + 4 + 18 > len(raw) or raw[at] & 0x7F != 0:  # STREAMINFO comes first
        return 0.0, False
    info = raw[at + 4 : at + 4 + 18]
    rate = int.from_bytes(info[10:13], "big") >> 4
    total = int.from_bytes(info[13:18], "big") & 0xF_FFFF_FFFF
    if rate == 0 or total == 0:  # zero: "unknown"
        return 0.0, False
    return total / rate, True


def _ogg(raw: bytes) -> tuple[float, bool]:
    """Every page walked: the largest granule position of each stream, at the rate its first
    packet (on its first page) states; the longest stream."""
    rates: dict[int, tuple[int, int]] = {}  # serial -> (samples a second, pre-skip)
    longest: dict[int, int] = {}
    at = 0
    for _ in range(OGG_PAGES_READ):
        if at + 27 > len(raw) or raw[at : at + 4] != b"OggS":
            break
        granule, serial = struct.unpack_from("<qI", raw, at + 6)
        segments = raw[at + 26]
        body = at + 27 + segments
        size = sum(raw[at + 27 : body])
        if serial not in rates:
            codec = _ogg_rate(raw[body : body + size])
            if codec is None:
                return 0.0, False
            rates[serial] = codec
        if granule >= 0:
            longest[serial] = max(longest.get(serial, 0), granule)
        at = body + size
    if not rates or at < len(raw):
        return 0.0, False
    seconds = [max(0, longest.get(s, 0) - skip) / rate for s, (rate, skip) in rates.items()]
    return max(seconds), True


def _ogg_rate(packet: bytes) -> tuple[int, int] | None:
    """(samples a second, pre-skip) from a stream's first packet, for the codecs read."""
    rate = 0
    skip = 0
    if packet[:7] == b"\x01vorbis" and len(packet) >= 16:
        rate = struct.unpack_from("<I", packet, 12)[0]
    elif packet[:8] == b"OpusHead" and len(packet) >= 12:
        rate, skip = 48000, struct.unpack_from("<H", packet, 10)[0]  # Opus granules count at 48 kHz
    elif packet[:5] == b"\x7fFLAC" and len(packet) >= 13 + 4 + 18:
        rate = int.from_bytes(packet[13 + 4 + 10 : 13 + 4 + 13], "big") >> 4
    elif packet[:8] == b"Speex   " and len(packet) >= 40:
        rate = struct.unpack_from("<I", packet, 36)[0]
    return (rate, skip) if rate > 0 else None


BOXES_READ = 200_000
ELEMENTS_READ = 2_000_000  # a two-hour WebM at 30 fps with its sound has about 600,000 blocks

# Boxes whose content is boxes, walked into.
_MP4_CONTAINERS = frozenset({b"moov", b"trak", b"mdia", b"minf", b"stbl", b"mvex", b"moof", b"traf", b"edts"})
_MP4_FIRST = frozenset({b"ftyp", b"moov", b"mdat", b"free", b"wide", b"skip", b"pnot"})

_EBML = 0x1A45DFA3
_SEGMENT, _CLUSTER, _INFO, _BLOCK_GROUP = 0x18538067, 0x1F43B675, 0x1549A966, 0xA0
_WALKED_INTO = frozenset({_SEGMENT, _CLUSTER, _INFO, _BLOCK_GROUP})
_TIMECODE_SCALE, _DURATION, _TIMECODE = 0x2AD7B1, 0x4489, 0xE7
_SIMPLE_BLOCK, _BLOCK, _BLOCK_DURATION = 0xA3, 0xA1, 0x9B


def video_seconds(raw: bytes) -> tuple[float, bool]:
    """(seconds, proven) of video file `raw`; (0.0, False) for a container not read here."""
    if raw[4:8] in _MP4_FIRST:
        return _mp4(raw)
    if raw[:4] == _EBML.to_bytes(4, "big"):
        return _matroska(raw)
    return 0.0, False


class _Mp4:
    """What the boxes state, as they are walked."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.movie_scale = 0
        self.track = 0  # the track being read (`tkhd`'s ID)
        self.scales: dict[int, int] = {}  # track ID -> its media timescale
        self.default_duration: dict[int, int] = {}  # track ID -> `trex`'s default sample duration
        self.fragments: dict[int, int] = {}  # track ID -> its fragments' summed durations
        self.fragment_track = 0
        self.fragment_default = 0

    def box(self, kind: bytes, data: bytes) -> None:
        if kind in (b"mvhd", b"mdhd", b"mehd"):
            version = data[0] if data else 0
            if kind == b"mehd":
                duration = _uint(data, 4, 8 if version == 1 else 4)
                scale = self.movie_scale
            else:
                at = 4 + (16 if version == 1 else 8)
                scale, duration = _uint(data, at, 4), _uint(data, at + 4, 8 if version == 1 else 4)
                if kind == b"mvhd":
                    self.movie_scale = scale
                else:
                    self.scales[self.track] = scale
            if scale and duration not in (0xFFFFFFFF, 0xFFFFFFFFFFFFFFFF):  # all ones: "unknown"
                self.seconds.append(duration / scale)
        elif kind == b"tkhd":
            self.track = _uint(data, 4 + (16 if data[:1] == b"\x01" else 8), 4)
        elif kind == b"stts":
            entries = min(_uint(data, 4, 4), len(data) // 8)
            total = sum(_uint(data, 8 + 8 * i, 4) * _uint(data, 12 + 8 * i, 4) for i in range(entries))
            scale = self.scales.get(self.track, 0)
            if scale:
                self.seconds.append(total / scale)
        elif kind == b"trex":
            self.default_duration[_uint(data, 4, 4)] = _uint(data, 12, 4)
        elif kind == b"tfhd":
            self._tfhd(data)
        elif kind == b"trun":
            self._trun(data)

    def _tfhd(self, data: bytes) -> None:
        flags, self.fragment_track = _uint(data, 1, 3), _uint(data, 4, 4)
        at = 8 + (8 if flags & 0x01 else 0) + (4 if flags & 0x02 else 0)
        given = _uint(data, at, 4) if flags & 0x08 else 0
        self.fragment_default = given or self.default_duration.get(self.fragment_track, 0)

    def _trun(self, data: bytes) -> None:
        flags, count = _uint(data, 1, 3), _uint(data, 4, 4)
        at = 8 + (4 if flags & 0x01 else 0) + (4 if flags & 0x04 else 0)
        if flags & 0x100:  # each sample states its duration
            step = 4 * sum(1 for bit in (0x100, 0x200, 0x400, 0x800) if flags & bit)
            count = min(count, max(0, (len(data) - at) // step))
            total = sum(_uint(data, at + i * step, 4) for i in range(count))
        else:
            total = count * self.fragment_default
        track = self.fragment_track
        self.fragments[track] = self.fragments.get(track, 0) + total

    def longest(self) -> float:
        fragments = [total / self.scales[t] for t, total in self.fragments.items() if self.scales.get(t)]
        return max(self.seconds + fragments, default=0.0)


def _mp4(raw: bytes) -> tuple[float, bool]:
    found = _Mp4()
    stack = [(0, len(raw))]
    boxes = 0
    while stack:
        at, end = stack.pop()
        while at + 8 <= end:
            boxes += 1
            if boxes > BOXES_READ:
                return found.longest(), False
            size, kind = struct.unpack_from(">I4s", raw, at)
            head = 8
            if size == 1 and at + 16 <= end:
                size, head = struct.unpack_from(">Q", raw, at + 8)[0], 16
            elif size == 0:
                size = end - at  # to the end of what holds it
            if size < head:
                return found.longest(), False
            box_end = min(at + size, end)
            if kind in _MP4_CONTAINERS:
                stack.append((box_end, end))  # the rest of this level, after the box's content
                at, end = at + head, box_end
                continue
            if kind != b"mdat":
                found.box(kind, raw[at + head : box_end])
            at = box_end
    seconds = found.longest()
    return seconds, seconds > 0


def _uint(data: bytes, at: int, size: int) -> int:
    return int.from_bytes(data[at : at + size], "big") if at + size <= len(data) else 0


def _matroska(raw: bytes) -> tuple[float, bool]:
    """The elements walked in order, into the segment, its info, clusters and block groups
    (whatever size they state, unknown included: their children follow them)."""
    scale, stated, latest, cluster_time = 1_000_000, 0.0, 0, 0
    at, read = 0, 0
    block_at = 0  # the time of the block last read (for its group's `BlockDuration`)
    while at < len(raw):
        read += 1
        if read > ELEMENTS_READ:  # what was read so far, not proven (the caller bounds the rest)
            return max(stated if stated == stated else 0.0, float(latest)) * scale / 1e9, False
        element = _vint(raw, at, keep_marker=True)
        if element is None:
            break
        ident, size_at = element
        sized = _vint(raw, size_at, keep_marker=False)
        if sized is None:
            break
        size, data_at = sized
        if ident in _WALKED_INTO:
            at = data_at
            continue
        if size < 0:  # an unknown size on an element that is not walked into: cannot be skipped
            return 0.0, False
        data = raw[data_at : data_at + size]
        if ident == _TIMECODE_SCALE:
            scale = int.from_bytes(data[:8], "big") or scale
        elif ident == _DURATION and len(data) == size and size in (4, 8):
            stated = struct.unpack(">f" if size == 4 else ">d", data)[0]
        elif ident == _TIMECODE:
            cluster_time = int.from_bytes(data[:8], "big")
        elif ident in (_SIMPLE_BLOCK, _BLOCK):
            track = _vint(data, 0, keep_marker=False)
            if track is not None and track[1] + 2 <= len(data):
                block_at = cluster_time + struct.unpack_from(">h", data, track[1])[0]
                latest = max(latest, block_at)
        elif ident == _BLOCK_DURATION:
            latest = max(latest, block_at + int.from_bytes(data[:8], "big"))
        at = data_at + size
    if stated != stated or stated in (float("inf"), float("-inf")):  # NaN or infinite: not a length
        stated = 0.0
    ticks = max(stated, float(latest))
    return ticks * scale / 1e9, ticks > 0


def _vint(data: bytes, at: int, keep_marker: bool) -> tuple[int, int] | None:
    """An EBML variable-length integer at `at`: (value, where it ends); a size of all ones is
    unknown (-1). None past the end or for a first byte of zero."""
    if at >= len(data) or data[at] == 0:
        return None
    first = data[at]
    length = 8 - first.bit_length() + 1
    if at + length > len(data):
        return None
    value = int.from_bytes(data[at : at + length], "big")
    if keep_marker:
        return value, at + length
    value &= (1 << (7 * length)) - 1
    return (-1 if value == (1 << (7 * length)) - 1 else value), at + length
