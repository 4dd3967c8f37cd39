"""Hostile parts and their honest twins of the same size, for the adversarial tests and
bench/adversarial.py: a PDF whose page tree states no count and never closes, and a tool whose
`$defs` each refer to the next K times."""

from __future__ import annotations

import base64
import json
import random
import string
import zlib
from typing import Any

PDF_HEAD = b"%PDF-1.7\n1 0 obj\n<</Length 0>>\nstream\n"
PDF_TAIL = b"\nendstream\nendobj\n%%EOF\n"


def pdf_without_count(inflated: int) -> bytes:
    """A PDF whose one stream inflates to `inflated` bytes of `/Type/Pages` with no `/Count` and
    no `>`: the text on which a backtracking page-count pattern is quadratic."""
    payload = (b"/Type/Pages " * (inflated // 12 + 1))[:inflated]
    return PDF_HEAD + zlib.compress(payload, 9) + PDF_TAIL


def pdf_no_larger_than(size: int) -> bytes:
    """The hostile PDF that inflates most while its base64 is at most `size` bytes (found by bisection)."""
    low, high = 1024, 64 * 1024 * 1024
    while high - low > 4096:
        middle = (low + high) // 2
        low, high = (middle, high) if len(base64.b64encode(pdf_without_count(middle))) <= size else (low, middle)
    return pdf_without_count(low)


def honest_pdf(size: int) -> bytes:
    """An ordinary one-page PDF of `size` bytes: a page tree with its count, a page, and a content
    stream of compressed text (random words, so that it compresses as text does), padded to size."""
    rng = random.Random(7)
    words = " ".join("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(size // 2))
    text = f"BT /F1 12 Tf 72 720 Td ({words}) Tj ET".encode()
    head = b"%PDF-1.7\n1 0 obj\n<</Type/Pages/Count 1/Kids [2 0 R]>>\nendobj\n2 0 obj\n<</Type/Page/Parent 1 0 R>>\nendobj\n"
    room = size - len(head) - len(b"3 0 obj\n<</Length 0>>\nstream\n") - len(PDF_TAIL)
    stream = zlib.compress(text, 9)[: max(0, room)]  # a stream cut short still inflates as far as it goes
    pdf = head + b"3 0 obj\n<</Length 0>>\nstream\n" + stream + PDF_TAIL
    return pdf + b"%" * max(0, size - len(pdf))


def file_part(pdf: bytes) -> dict[str, Any]:
    data = "data:application/pdf;base64," + base64.b64encode(pdf).decode()
    return {"type": "file", "file": {"filename": "report.pdf", "file_data": data}}


def chat_with_file(pdf: bytes, model: str = "gpt-4o") -> bytes:
    content = [{"type": "text", "text": "Summarise this report."}, file_part(pdf)]
    return json.dumps({"model": model, "messages": [{"role": "user", "content": content}]}).encode()


def ref_chain(fan_out: int, depth: int) -> dict[str, Any]:
    """A function whose `$defs` each refer to the next `fan_out` times, `depth` deep: written out in
    place, it is `fan_out ** depth` copies of the leaf."""
    defs: dict[str, Any] = {}
    for i in range(depth):
        nxt = {"$ref": f"#/$defs/d{i + 1}"} if i + 1 < depth else {"type": "string"}
        defs[f"d{i}"] = {"type": "object", "properties": {f"p{j}": nxt for j in range(fan_out)}}
    parameters = {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d0"}}}
    return {"name": "lookup", "description": "a chain", "parameters": parameters}


def plain_function(size: int) -> dict[str, Any]:
    """An ordinary function whose JSON is about `size` bytes: string properties with descriptions."""
    properties: dict[str, Any] = {}
    function = {
        "name": "lookup",
        "description": "Look a record up.",
        "parameters": {"type": "object", "properties": properties},
    }
    i = 0
    while len(json.dumps(function)) < size - 80:
        properties[f"field_{i}"] = {"type": "string", "description": f"The record's field number {i}."}
        i += 1
    function["description"] += " " * max(0, size - len(json.dumps(function)))  # to the byte
    return function


def chat_with_tool(function: dict[str, Any], model: str = "gpt-4o") -> bytes:
    body = {"model": model, "messages": [{"role": "user", "content": "Look it up."}],
            "tools": [{"type": "function", "function": function}]}  # fmt: skip
    return json.dumps(body).encode()
