"""How many pages a PDF has, read from its page tree as a PDF reader finds it, or a bound.

A reader starts at the trailer's `/Root` (in a `trailer` dictionary or, since PDF 1.5, in the
dictionary of a compressed cross-reference stream), goes to the catalog's `/Pages` and walks the
tree of `/Kids`: every leaf is a page, and each node states its leaves as `/Count` (some readers
take the root's `/Count`, others walk). The pages counted are the larger of the two, for every
`/Root` the file states (an updated file states one per revision), so neither reading is above it.

Objects are found where they are written, not where the cross-reference table says they are (a
reader rebuilds a damaged table the same way): every `N G obj` in the file, and every object of an
object stream (`/Type /ObjStm`, Flate-compressed, which holds the page objects of most PDFs written
since 1.5). Names are read with their `#xx` escapes (`/P#61ge` is `/Page`).

When the tree cannot be walked (no root, a reference that leads nowhere, an object stream
compressed otherwise than by Flate), the pages are bounded: by what any walk or root's `/Count`
showed and by the file's objects (a page is an object; a tree that lists one several times is
walked whole), or, with an object stream that could not be read, a cycle or more nodes than
`NODES_READ`, by `PAGES_MOST`. `PdfPages.proven`
says which it is. Pages are never counted past `PAGES_MOST`: more than any window holds at any
provider's rate, and a finite number however large the file claims.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

# More pages than any provider accepts (Gemini: 1,000 a document) and, at its cheapest documented
# rate, more tokens than any window: a count past it says only "over".
PAGES_MOST = 10_000
NODES_READ = 20_000  # page tree nodes walked at most (a real tree of 10,000 pages has ~10,200)
_TREE_DEPTH = 64  # levels of a page tree walked at most (a real one has a few)
_DEPTH = 32  # nesting of arrays and dictionaries read, at most
# Bytes of the file per syntax step (a token, a string's parenthesis) read, over all its objects:
# a forged file whose objects overlap (an unclosed string holding `N 0 obj (` a thousand times)
# would otherwise be read again from each of them. qpdf's 1,000-page files take a step per 16 bytes.
_BYTES_PER_STEP = 4
_STEPS_PER_OBJECT = 8  # an object's header and its first tokens: what reading one costs at least
_OBJ = re.compile(rb"(\d{1,10})[ \t\r\n\f\x00]+\d{1,5}[ \t\r\n\f\x00]+obj\b")
_TRAILER = re.compile(rb"trailer[ \t\r\n\f\x00]*<<")
_STREAM = re.compile(rb"[ \t\r\n\f\x00]*stream(\r\n|\n|\r)")
_WS = b" \t\r\n\f\x00"
_TOKEN_END = re.compile(rb"[ \t\r\n\f\x00()<>\[\]{}/%]")
_NUMBER = re.compile(rb"[+-]?(\d+\.?\d*|\.\d+)")
_REF = re.compile(rb"[ \t\r\n\f\x00]+(\d{1,10})[ \t\r\n\f\x00]+R(?![^ \t\r\n\f\x00()<>\[\]{}/%])")
_STRING_MARK = re.compile(rb"[\\\\()]")
_ESCAPE = re.compile(rb"#([0-9A-Fa-f]{2})")


@dataclass(frozen=True, slots=True)
class Ref:
    number: int


@dataclass(frozen=True, slots=True)
class PdfPages:
    pages: int
    proven: bool  # read from the page tree; False: a bound


class _Unreadable(Exception):
    """The syntax at hand is not a PDF object the reader can take."""


def pdf_pages(raw: bytes, inflate_cap: int) -> PdfPages:
    """The pages of PDF `raw`, reading at most `inflate_cap` inflated bytes of object streams."""
    steps = [len(raw) // _BYTES_PER_STEP + 10_000]
    objects, roots, unread_stream = _objects(raw, inflate_cap, steps)
    if steps[0] <= 0:  # not read to its end: nothing is proven, and its objects are not all known
        return PdfPages(PAGES_MOST, False)
    walks = [_tree_pages(objects, root) for root in roots]
    seen = max((pages for pages, _ in walks), default=0)  # what any walk or root's `/Count` showed
    if walks and all(proven for _, proven in walks):
        return PdfPages(max(1, min(seen, PAGES_MOST)), True)
    if unread_stream or seen >= PAGES_MOST:
        return PdfPages(PAGES_MOST, False)
    return PdfPages(max(1, min(max(seen, len(objects)), PAGES_MOST)), False)


def _objects(raw: bytes, inflate_cap: int, steps: list[int]) -> tuple[dict[int, object], list[object], bool]:
    """Every indirect object found (a later definition of a number replacing an earlier one, as an
    update does), the roots the trailers name, and whether an object stream could not be read."""
    objects: dict[int, object] = {}
    roots: list[object] = []
    streams: list[tuple[dict[str, object], int]] = []
    for found in _OBJ.finditer(raw):
        steps[0] -= _STEPS_PER_OBJECT
        try:
            value, end = _Parser(raw, steps).value(found.end(), 0)
        except (_Unreadable, IndexError, ValueError, RecursionError):
            continue
        objects[int(found.group(1))] = value
        if isinstance(value, dict):
            stream = _STREAM.match(raw, end)
            if stream is not None:
                streams.append((value, stream.end()))
    for found in _TRAILER.finditer(raw):
        try:
            trailer, _ = _Parser(raw, steps).value(found.end() - 2, 0)
        except (_Unreadable, IndexError, ValueError, RecursionError):
            continue
        if isinstance(trailer, dict) and "Root" in trailer:
            roots.append(trailer["Root"])
    unread, left = False, inflate_cap
    for head, start in streams:
        if head.get("Type") == "XRef" and "Root" in head:
            roots.append(head["Root"])
        if head.get("Type") != "ObjStm":
            continue
        data = _inflated(raw, head, start, left)
        if data is None:
            unread = True
            continue
        left -= len(data)
        steps[0] += len(data) // _BYTES_PER_STEP
        objects.update(_stream_objects(data, head, steps))
    return objects, roots, unread


def _inflated(raw: bytes, head: dict[str, object], start: int, room: int) -> bytes | None:
    """A stream's data, inflated when its filter is Flate alone; None when it is compressed
    otherwise (or with a predictor), is damaged, or inflates past `room`."""
    filters = head.get("Filter")
    filters = filters if isinstance(filters, list) else [] if filters is None else [filters]
    if head.get("DecodeParms") not in (None, [], {}, [None]) or filters not in ([], ["FlateDecode"], ["Fl"]):
        return None
    end = raw.find(b"endstream", start)
    if end < 0:
        return None
    if not filters:
        return raw[start:end]
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(memoryview(raw)[start:end], max(room, 0) + 1)
    except zlib.error:
        return None
    return None if len(data) > room else data


def _stream_objects(data: bytes, head: dict[str, object], steps: list[int]) -> Iterator[tuple[int, object]]:
    """The objects of an object stream: `N` pairs of (object number, offset from `/First`)."""
    count, first = head.get("N"), head.get("First")
    if not isinstance(count, int) or not isinstance(first, int) or count < 0 or first < 0:
        return
    parser = _Parser(data, steps)
    numbers = re.findall(rb"\d+", data[:first])
    for k in range(min(count, len(numbers) // 2)):
        try:
            value, _ = parser.value(first + int(numbers[2 * k + 1]), 0)
        except (_Unreadable, IndexError, ValueError, RecursionError):
            continue
        yield int(numbers[2 * k]), value


def _tree_pages(objects: dict[int, object], root: object) -> tuple[int, bool]:
    """(pages, proven) under the catalog `root` names: the larger of the root node's `/Count` and
    the leaves walked, every occurrence of a kid counted (a page listed twice is shown twice). Not
    proven when the tree cannot be walked: a reference that leads nowhere, a node in its own
    ancestry (a cycle: then `PAGES_MOST`, as a reader that follows it never ends), more than
    `NODES_READ` nodes or `_TREE_DEPTH` levels (then `PAGES_MOST`: shared nodes can list more pages
    than there are objects)."""
    catalog = _resolved(objects, root)
    reference = catalog.get("Pages") if isinstance(catalog, dict) else None
    top = _resolved(objects, reference)
    if not isinstance(top, dict):
        return 0, False
    stated = _resolved(objects, top.get("Count"))
    stated = stated if isinstance(stated, int) and stated > 0 else 0
    leaves, nodes = 0, 0
    stack: list[tuple[object, tuple[int, ...]]] = [(reference, ())]  # a kid and its ancestors' numbers
    while stack:
        entry, ancestors = stack.pop()
        nodes += 1
        if nodes > NODES_READ or len(ancestors) > _TREE_DEPTH or (isinstance(entry, Ref) and entry.number in ancestors):
            return PAGES_MOST, False
        node = _resolved(objects, entry)
        if not isinstance(node, dict):
            return max(leaves, stated), False
        kids = _resolved(objects, node.get("Kids"))
        if node.get("Type") == "Pages" or (node.get("Type") != "Page" and isinstance(kids, list)):
            if not isinstance(kids, list):
                return max(leaves, stated), False
            inner = (*ancestors, entry.number) if isinstance(entry, Ref) else ancestors
            stack.extend((kid, inner) for kid in kids)
        else:
            leaves += 1
    return max(leaves, stated), True


def _resolved(objects: dict[int, object], value: object) -> object:
    return objects.get(value.number) if isinstance(value, Ref) else value


class _Parser:
    """PDF object syntax (ISO 32000-1, 7.3): dictionaries (keys as unescaped names), arrays,
    references, names, numbers; strings, booleans and null read past as None."""

    __slots__ = ("data", "steps")

    def __init__(self, data: bytes, steps: list[int]) -> None:
        self.data = data
        self.steps = steps  # shared by every parser of the file: what is left of its budget

    def value(self, at: int, depth: int) -> tuple[object, int]:
        data = self.data
        at = self._skip(at)
        self.steps[0] -= 1
        if depth > _DEPTH or self.steps[0] <= 0:
            raise _Unreadable("nested too deep, or read too long")
        head = data[at : at + 2]
        if head == b"<<":
            return self._dictionary(at + 2, depth)
        char = data[at : at + 1]
        if char == b"[":
            items: list[object] = []
            at += 1
            while True:
                at = self._skip(at)
                if data[at : at + 1] == b"]":
                    return items, at + 1
                item, at = self.value(at, depth + 1)
                items.append(item)
        if char == b"/":
            end = _end_of_token(data, at + 1)
            return _name(data[at + 1 : end]), end
        if char == b"(":
            return None, self._literal_end(at)
        if char == b"<":
            end = data.index(b">", at)
            return None, end + 1
        number = _NUMBER.match(data, at)
        if number is not None:
            ref = _REF.match(data, number.end()) if b"." not in number.group(0) else None
            if ref is not None:
                return Ref(int(number.group(0))), ref.end()
            text = number.group(0)
            return (float(text) if b"." in text else int(text)), number.end()
        end = _end_of_token(data, at)
        if end == at:
            raise _Unreadable("no object")
        return None, end  # true, false, null (and a keyword out of place: the caller's object ends)

    def _dictionary(self, at: int, depth: int) -> tuple[dict[str, object], int]:
        data, entries = self.data, dict[str, object]()
        while True:
            at = self._skip(at)
            if data[at : at + 2] == b">>":
                return entries, at + 2
            if data[at : at + 1] != b"/":
                raise _Unreadable("a dictionary key that is not a name")
            end = _end_of_token(data, at + 1)
            key = _name(data[at + 1 : end])
            entries[key], at = self.value(end, depth + 1)

    def _skip(self, at: int) -> int:
        data = self.data
        while True:
            while data[at] in _WS:
                at += 1
            if data[at] != 0x25:  # %: a comment to the end of the line
                return at
            at = min(i for i in (data.find(b"\n", at), data.find(b"\r", at), len(data)) if i >= 0)

    def _literal_end(self, at: int) -> int:
        """The end of a literal string: balanced parentheses, a backslash escaping the next byte."""
        data, level = self.data, 0
        while True:
            self.steps[0] -= 1
            if self.steps[0] <= 0:
                raise _Unreadable("read too long")
            found = _STRING_MARK.search(data, at)
            if found is None:
                raise _Unreadable("a string that does not end")
            char, at = data[found.start()], found.end()
            if char == 0x5C:
                at += 1
            elif char == 0x28:
                level += 1
            else:
                level -= 1
                if level == 0:
                    return at


def _end_of_token(data: bytes, at: int) -> int:
    found = _TOKEN_END.search(data, at)
    return found.start() if found is not None else len(data)


def _name(raw: bytes) -> str:
    if b"#" in raw:
        raw = _ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), raw)
    return raw.decode("latin-1")
