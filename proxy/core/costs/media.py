"""What audio and file parts of a message cost: no provider publishes a rule, so both are
bounded from above, and say so.

- **Audio** (`input_audio`): Gemini documents 32 tokens per second, the highest published rate;
  the length is read from a WAV header (by the slower of its stated byte rate and the one its
  sample rate, channels and sample size give: decoders use the latter), and audio of another
  format is assumed to be 16 kbit/s, a lower rate than any common codec, so that its length is
  overestimated.
- **Video** (`input_video`): an adapter states its length and the rate a second costs (Gemini's
  published 263 tokens a second, with its sound's 32), and says when the length is an estimate.
- **Files** (`file` with `file_data`): providers show each page as extracted text and as an
  image, so a page costs the model's largest image and the text at most a token per 3 bytes.
  A PDF's pages and text are read from its compressed streams too (object streams hold the page
  objects of most PDFs written since 1.5; content streams hold the text): pages are the most of
  the page objects seen and the largest `/Count` of a page tree, and the text is bounded by the
  file's bytes and its streams' inflated bytes. A zipped document (docx, xlsx, pptx, odt, epub:
  a ZIP archive of XML) is one page and its members' inflated bytes of text, as a provider that
  reads it extracts its text from those. Streams or members inflating past `FILE_INFLATE_CAP` are
  counted as that much text (the request is then over any window).
  A file sent by `file_id` is not visible to the guard and is not counted (the note says so).

Each function returns (text tokens, media tokens, notes), as a content part's count does.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
import struct
import zlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from proxy.core.costs.images import ImageCostScheme
from proxy.core.work_budget import spend

if TYPE_CHECKING:
    import zipfile

AUDIO_TOKENS_PER_SECOND = 32
AUDIO_ASSUMED_BYTES_PER_SECOND = 2000
# Inflated bytes read of one file (a PDF's streams, a zipped document's members), at most: more
# text than any model's window holds (2.8M tokens at a token per 3 bytes), and tens of
# milliseconds to inflate at worst, on the loop when the body is small (a compressed bomb must not
# stall every other request for longer).
FILE_INFLATE_CAP = 8 * 1024 * 1024
# Members of a zipped document read, at most: a real one has tens to hundreds; more are counted
# as the cap (each costs tens of microseconds to open, on the loop when the body is small).
ZIP_MEMBERS_READ = 1_000
_ZIP_MAGIC = b"PK\x03\x04"
_ZIP_END = b"PK\x05\x06"  # the end of central directory record: its entries and directory size
_ZIP_END_SEARCH = 22 + 65_535  # the record and the longest comment after it
_ZIP_ENTRY_BYTES = 128  # a directory entry's bytes, at most, for the names a document's members have
_ZIP_ENCRYPTED = 0x1
_ZIP_STORED, _ZIP_DEFLATED = 0, 8  # the compression methods read (zipfile's ZIP_STORED, ZIP_DEFLATED)
_ZIP_CHUNK = 64 * 1024
# The PDF patterns below are linear: each repeats one character class right after a literal
# that cannot occur inside that class, so no match attempt rescans what another scanned.
_PDF_STREAM = re.compile(rb"stream\r?\n")
_PDF_FEED_PER_BYTE = 4  # bytes fed to inflaters per byte of a PDF, at most (see _pdf_bound)
# The white space inside a match is bounded, so a match is at most `_PDF_MATCH_MAX` bytes long and
# a long text is searched in windows that overlap by that much: no one call into the regex engine
# (which holds the GIL while the event loop waits) scans more than a window.
_PDF_PAGE = re.compile(rb"/Type\s{0,256}/Page(?![a-zA-Z])")
_PDF_TREE = re.compile(rb"/Type\s{0,256}/Pages\b")
_PDF_COUNT = re.compile(rb"/Count\s{1,256}(\d{1,9})")
_PDF_MATCH_MAX = 300
_PDF_WINDOW = 128 * 1024


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


def video_cost(part: Mapping[str, Any]) -> tuple[int, int, list[str]]:
    """A video part as an adapter states it (`input_video`: its length in seconds and the rate a
    second of it costs, both the adapter's, from the provider's published rule)."""
    spec = part.get("input_video")
    seconds = spec.get("seconds") if isinstance(spec, Mapping) else None
    rate = spec.get("tokens_per_second") if isinstance(spec, Mapping) else None
    if not isinstance(seconds, int | float) or not isinstance(rate, int) or seconds < 0:
        return 0, 0, ["video part without a length; not counted"]
    tokens = math.ceil(seconds * rate)
    return 0, tokens, [f"video of {seconds:.0f} s priced at {rate} tokens/s"]


def file_cost(part: Mapping[str, Any], images: ImageCostScheme) -> tuple[int, int, list[str]]:
    spec = part.get("file")
    if not isinstance(spec, Mapping):
        return 0, 0, ["file part without a file; not counted"]
    data = spec.get("file_data")
    if not isinstance(data, str):
        return 0, 0, ["file sent by file_id: its content is not visible to the guard and is not counted"]
    spend(len(data))  # decoded, inflated and scanned: work that grows with the file
    raw = _b64_decode(data.split(",", 1)[1] if data.startswith("data:") else data)
    pages, text_bytes, capped = _zip_bound(raw) if raw.startswith(_ZIP_MAGIC) else _pdf_bound(raw)
    # Each page priced as the most an image costs at the detail asked (a Gemini media resolution).
    detail = spec.get("detail")
    tokens = pages * images.max_cost(detail if isinstance(detail, str) else "high") + math.ceil(text_bytes / 3)
    notes = [f"file of {pages} page(s) estimated at {tokens} tokens"]
    if capped:
        notes.append(f"its content inflates past {FILE_INFLATE_CAP} bytes: counted as that much text")
    return 0, tokens, notes


def _pdf_bound(raw: bytes) -> tuple[int, int, bool]:
    """(pages, bytes of text at most, whether the inflated streams reached the cap) of a file:
    its bytes and those its Flate streams inflate to are searched for page objects and page
    trees' counts. A file that is not a PDF is one page of its own bytes.

    Every `stream` keyword starts a stream that runs to the next `endstream`, as before; what is
    fed to the inflater is bounded by `_PDF_FEED_PER_BYTE` times the file (a PDF feeds each byte
    at most twice: its streams, and the object after each `endstream`, whose own `stream\n` the
    search also finds). A file that would feed more (streams started inside streams) counts as
    the cap."""
    inflated: list[bytes] = []
    total, capped = 0, False
    view = memoryview(raw)
    feed_left = _PDF_FEED_PER_BYTE * len(raw)
    end = -1
    for found in _PDF_STREAM.finditer(raw):
        if end < found.end():  # the next `endstream`, found once for every start before it
            end = raw.find(b"endstream", found.end())
            if end < 0:
                break
        feed_left -= end - found.end()
        if feed_left < 0:
            total, capped = FILE_INFLATE_CAP, True
            break
        inflater = zlib.decompressobj()
        try:
            chunk = inflater.decompress(view[found.end() : end], FILE_INFLATE_CAP - total)
        except zlib.error:  # not Flate (an image's DCT, or plain): its raw bytes are counted already
            continue
        inflated.append(chunk)
        total += len(chunk)
        if inflater.unconsumed_tail or total >= FILE_INFLATE_CAP:
            capped = True
            break
    objects, counts = 0, [0]
    for text in (raw, *inflated):
        objects += sum(1 for _ in _windowed(_PDF_PAGE, text))
        counts += _page_tree_counts(text)
    return max(1, objects, *counts), len(raw) + total, capped


def _windowed(pattern: re.Pattern[bytes], text: bytes) -> Iterator[re.Match[bytes]]:
    """`pattern`'s matches in `text`, found window by window: each window is searched to
    `_PDF_MATCH_MAX` bytes past its end, and only the matches that start inside it are taken."""
    for start in range(0, len(text), _PDF_WINDOW):
        end = start + _PDF_WINDOW
        for found in pattern.finditer(text, start, end + _PDF_MATCH_MAX):
            if found.start() >= end:
                break
            yield found


def _page_tree_counts(text: bytes) -> list[int]:
    """Every `/Count` that shares a dictionary with a `/Type /Pages` (no `>` between them): the
    page counts a page tree states, and possibly more (an upper bound is what is wanted). One pass
    over the two patterns' matches, the `>`s between consecutive ones counted by `bytes.count`."""
    if b"/Count" not in text or b"/Pages" not in text:  # nothing to pair (a C scan each)
        return []
    marks = sorted([(m.start(), -1) for m in _windowed(_PDF_TREE, text)] + [
        (m.start(), int(m.group(1))) for m in _windowed(_PDF_COUNT, text)
    ])  # fmt: skip
    counts: list[int] = []
    segment: list[int] = []  # the counts of the dictionary being read
    has_tree, at = False, 0
    for position, value in marks:
        if text.count(b">", at, position):  # a dictionary closed since the last mark
            if has_tree:
                counts += segment
            segment, has_tree = [], False
        at = position
        if value < 0:
            has_tree = True
        else:
            segment.append(value)
    if has_tree:
        counts += segment
    return counts


def _zip_bound(raw: bytes) -> tuple[int, int, bool]:
    """(one page, bytes of text at most, whether the members reached the cap) of a zipped
    document: its bytes and every member inflated, as far as the cap. What cannot be read within
    a bound counts as the cap: more members than `ZIP_MEMBERS_READ` (or a directory too large for
    that many: the archive's own reader walks all of it), and a member compressed otherwise than
    by deflate (bzip2 and LZMA inflate a read whole) or encrypted. A damaged member counts what
    inflates of it; an archive whose directory does not read is its own bytes, as any file is."""
    import zipfile  # here: the serving process loads it only when a zipped file comes

    capped = 1, len(raw) + FILE_INFLATE_CAP, True
    end = raw.rfind(_ZIP_END, max(0, len(raw) - _ZIP_END_SEARCH))
    if end >= 0 and len(raw) >= end + 22:
        entries, directory_bytes = struct.unpack_from("<HI", raw, end + 10)
        if entries > ZIP_MEMBERS_READ or directory_bytes > ZIP_MEMBERS_READ * _ZIP_ENTRY_BYTES:
            return capped
    try:
        archive = zipfile.ZipFile(io.BytesIO(raw))
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError, RuntimeError, struct.error):
        return 1, len(raw), False
    total = 0
    with archive:
        members = archive.infolist()
        if len(members) > ZIP_MEMBERS_READ:
            return capped
        for info in members:
            read = _member_bytes(raw, info, FILE_INFLATE_CAP - total)
            if read is None:
                return capped
            total += read
            if total > FILE_INFLATE_CAP:
                return capped
    return 1, len(raw) + total, False


def _member_bytes(raw: bytes, info: zipfile.ZipInfo, room: int) -> int | None:
    """The bytes member `info` inflates to, as far as `room` + 1; None for one that cannot be read
    within a bound (compressed otherwise than by deflate, or encrypted). Read from the archive's
    bytes, not through the archive's reader, so that a checksum found wrong at the member's end
    (which that reader raises with the last read's bytes unreturned) leaves the count whole; data
    damaged midway counts what inflated before the damage, less at most one chunk."""
    if info.compress_type not in (_ZIP_STORED, _ZIP_DEFLATED) or info.flag_bits & _ZIP_ENCRYPTED:
        return None
    at = info.header_offset
    if raw[at : at + 4] != _ZIP_MAGIC or len(raw) < at + 30:
        return 0
    name_bytes, extra_bytes = struct.unpack_from("<HH", raw, at + 26)
    start = at + 30 + name_bytes + extra_bytes
    data = memoryview(raw)[start : start + info.compress_size]
    if info.compress_type == _ZIP_STORED:
        return min(len(data), room + 1)
    inflater, read = zlib.decompressobj(-zlib.MAX_WBITS), 0
    pending: bytes | memoryview = data
    try:
        while read <= room and pending and not inflater.eof:
            read += len(inflater.decompress(pending, min(_ZIP_CHUNK, room + 1 - read)))
            pending = inflater.unconsumed_tail
    except zlib.error:
        pass
    return read


def _b64_decode(data: str) -> bytes:
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return data.encode("utf-8", "replace")


def _wav_seconds(data: str) -> float | None:
    head = _b64_decode(data[:64])
    if len(head) < 44 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    channels, sample_rate, stated = struct.unpack("<HII", head[22:32])
    (bits,) = struct.unpack("<H", head[34:36])
    rates: list[int] = [r for r in (int(stated), int(sample_rate) * int(channels) * int(bits) // 8) if r > 0]
    if not rates:
        return None
    return max(0.0, len(data) * 3 / 4 - 44) / min(rates)  # the slower rate: the longer, a bound
