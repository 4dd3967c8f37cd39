"""How long a video plays, read from its container as a demuxer reads it.

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
