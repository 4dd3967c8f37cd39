"""What audio, video and file parts of a message cost, at the provider's documented rates where
it documents them, and never under them: a length or a page count that cannot be read from the
file's own structure is bounded, and the part's note says it is an estimate.

- **Audio** (`input_audio`): Gemini documents 32 tokens per second ("Understand and count
  tokens", https://ai.google.dev/gemini-api/docs/tokens), the highest published rate (OpenAI
  publishes none, so its audio is priced at it too); the length is read from the format's own
  structure (`proxy.core.costs.media_lengths`: WAV, MP3, FLAC, Ogg; M4A and WebM audio by their
  containers, `proxy.core.costs.media_lengths`); audio of another format, or
  one that cannot be followed, is assumed to be 16 kbit/s, a lower rate than any common codec's.
- **Video** (`input_video` with `data`): the length is read from the container
  (`proxy.core.costs.media_lengths`: MP4, MOV, WebM, Matroska) and each second costs `fps`
  frames (1 unless the part asks for another rate) at the model's frame rate
  (`ImageCostScheme.frame_cost`: Gemini 2.x 258, 66 at a low media resolution; Gemini 3 by the
  level asked), its sound's 32 and `VIDEO_METADATA_PER_SECOND` for the timestamps Gemini adds
  each second: 300 a second at Gemini 2.x's default, the figure its "Video understanding" page
  gives ("about 300 tokens per second", https://ai.google.dev/gemini-api/docs/video-understanding),
  above the 263 of "Understand and count tokens". A container that cannot be read is assumed to
  carry 16 kbit/s. An adapter may still state the length and rate itself (`seconds`,
  `tokens_per_second`).
- **Files** (`file` with `file_data`): a provider that documents a page's cost (Gemini 2.x: 258
  tokens a page, "Document understanding", https://ai.google.dev/gemini-api/docs/document-processing;
  Gemini 3: the media resolution's, MEDIUM's 560 by default) is priced at it, per page
  (`ImageCostScheme.page_cost`). Others show each page as extracted text and as an image, so a
  page costs the model's largest image and the text at most a token per 3 bytes, bounded by the
  file's bytes and its streams' inflated bytes. A PDF's pages are read from its page tree
  (`proxy.core.costs.pdf_pages`, object streams included), or bounded when the tree cannot be
  walked. A zipped document (docx, xlsx, pptx, odt, epub:
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
from proxy.core.costs.media_lengths import audio_seconds, video_seconds
from proxy.core.costs.pdf_pages import PAGES_MOST, pdf_pages
from proxy.core.work_budget import spend

if TYPE_CHECKING:
    import zipfile

AUDIO_TOKENS_PER_SECOND = 32
AUDIO_ASSUMED_BYTES_PER_SECOND = 2000
VIDEO_ASSUMED_BYTES_PER_SECOND = 2000  # 16 kbit/s: below any watchable video's rate
VIDEO_METADATA_PER_SECOND = 10  # 258 + 32 + 10 = Gemini's "about 300 tokens per second"
VIDEO_FPS_MOST = 24.0  # Gemini samples at most this many frames a second, whatever is asked
# A day: a length past it (however long a header claims) is counted as a day, over any window at
# any rate, so that a forged header's count stays a finite "over", not a 1e15 in the metrics.
MEDIA_SECONDS_MOST = 86_400.0
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
    spend(len(data))  # decoded and walked: work that grows with the audio
    raw = _b64_decode(data)
    seconds, proven = audio_seconds(raw)
    if not proven:  # sound in a video container (M4A is MP4, WebM audio is Matroska)
        seconds, proven = video_seconds(raw)
    if not proven:
        seconds = max(seconds, len(data) * 3 / 4 / AUDIO_ASSUMED_BYTES_PER_SECOND)
    seconds = min(seconds, MEDIA_SECONDS_MOST)
    tokens = math.ceil(seconds * AUDIO_TOKENS_PER_SECOND)
    note = [] if proven else [f"audio length estimated from its size ({seconds:.1f} s)"]
    note.append(f"audio of {seconds:.1f} s priced at {AUDIO_TOKENS_PER_SECOND} tokens/s, the highest published rate")
    return 0, tokens, note


def video_cost(part: Mapping[str, Any], images: ImageCostScheme) -> tuple[int, int, list[str]]:
    """A video part: its data's length read from its container (`data`, `fps`, `detail`: a media
    resolution), or as an adapter states it (`seconds` and `tokens_per_second`)."""
    spec = part.get("input_video")
    if not isinstance(spec, Mapping):
        return 0, 0, ["video part without data; not counted"]
    data = spec.get("data")
    if not isinstance(data, str):
        return _stated_video(spec)
    spend(len(data))  # decoded and walked: work that grows with the video
    seconds, proven = video_seconds(_b64_decode(data))
    if not proven:
        seconds = max(seconds, len(data) * 3 / 4 / VIDEO_ASSUMED_BYTES_PER_SECOND)
    seconds = min(seconds, MEDIA_SECONDS_MOST)
    fps = spec.get("fps")
    fps = min(float(fps), VIDEO_FPS_MOST) if isinstance(fps, int | float) and fps > 0 else 1.0
    detail = spec.get("detail")
    frame = images.frame_cost(detail if isinstance(detail, str) else "high")
    rate = frame * fps + AUDIO_TOKENS_PER_SECOND + VIDEO_METADATA_PER_SECOND
    tokens = math.ceil(seconds * rate)
    notes = [] if proven else [f"video length estimated from its size ({seconds:.0f} s)"]
    notes.append(f"video of {seconds:.1f} s priced at {rate:g} tokens/s ({fps:g} frame/s at {frame})")
    return 0, tokens, notes


def _stated_video(spec: Mapping[str, Any]) -> tuple[int, int, list[str]]:
    seconds, rate = spec.get("seconds"), spec.get("tokens_per_second")
    if not isinstance(seconds, int | float) or not isinstance(rate, int) or seconds < 0:
        return 0, 0, ["video part without a length; not counted"]
    return 0, math.ceil(seconds * rate), [f"video of {seconds:.0f} s priced at {rate} tokens/s"]


def file_cost(part: Mapping[str, Any], images: ImageCostScheme) -> tuple[int, int, list[str]]:
    spec = part.get("file")
    if not isinstance(spec, Mapping):
        return 0, 0, ["file part without a file; not counted"]
    data = spec.get("file_data")
    if not isinstance(data, str):
        return 0, 0, ["file sent by file_id: its content is not visible to the guard and is not counted"]
    spend(len(data))  # decoded, inflated and scanned: work that grows with the file
    raw = _b64_decode(data.split(",", 1)[1] if data.startswith("data:") else data)
    detail = spec.get("detail")
    detail = detail if isinstance(detail, str) else "high"
    per_page = images.page_cost(detail)
    if per_page is not None and b"%PDF-" in raw[:1024]:  # a PDF page's documented cost, its text in it
        counted = pdf_pages(raw, FILE_INFLATE_CAP)
        tokens = counted.pages * per_page
        how = "read from its page tree" if counted.proven else "a bound: its page tree could not be walked"
        return 0, tokens, [f"file of {counted.pages} page(s) ({how}) priced at {per_page} tokens a page"]
    pages, text_bytes, capped = _zip_bound(raw) if raw.startswith(_ZIP_MAGIC) else _pdf_bound(raw)
    # Each page priced as the most an image costs at the detail asked, and its text besides.
    tokens = pages * images.max_cost(detail) + math.ceil(text_bytes / 3)
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
    objects, counts = 0, [0, pdf_pages(raw, FILE_INFLATE_CAP).pages if raw.startswith(b"%PDF") else 1]
    for text in (raw, *inflated):
        objects += sum(1 for _ in _windowed(_PDF_PAGE, text))
        counts += _page_tree_counts(text)
    return min(max(1, objects, *counts), PAGES_MOST), len(raw) + total, capped


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
