"""Conversations by kind of content, for the real-backend tests and bench/real_backend.py.

Built from the samples under tests/data/samples, every message distinct (numbered, and cut at a
different place each turn), so no two requests share text by accident. `size` is a number of
turns; the same `size` makes conversations of very different token counts per kind, which is
the point: an estimate that is right for English is wrong for CJK or digits.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

SAMPLES = {
    p.name.removesuffix(".txt"): p.read_text(encoding="utf-8")
    for p in (Path(__file__).resolve().parents[1] / "data" / "samples").glob("*.txt")
}
Message = dict[str, Any]


def _cut(text: str, i: int, share: float = 0.6) -> str:
    """A distinct slice of `text`: at least `share` of it, starting further in each turn."""
    start = (i * 97) % max(1, int(len(text) * (1 - share)))
    return text[start:] + text[:start]


def _part(text: str, i: int, share: float) -> str:
    """`share` of `text`, starting further in each turn."""
    return _cut(text, i)[: int(len(text) * share)]


def english(size: int) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "You are a concise assistant."}]
    for i in range(size):
        messages.append({"role": "user", "content": f"Question {i}: summarise this.\n{_cut(SAMPLES['english'], i)}"})
        messages.append({"role": "assistant", "content": f"Summary {i}: {_cut(SAMPLES['english'], i + 7, 0.3)}"})
    messages.append({"role": "user", "content": "Now say hi in one word."})
    return messages


def code(size: int) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "You review Python code."}]
    for i in range(size):
        source = SAMPLES["code.py"].replace("RateLimiter", f"RateLimiter{i}")
        messages.append({"role": "user", "content": f"Review #{i}:\n```python\n{source}\n```"})
        messages.append({"role": "assistant", "content": f"```python\n# fixed {i}\n{_cut(source, i, 0.4)}\n```"})
    messages.append({"role": "user", "content": "Which version is best? One word."})
    return messages


def cjk(size: int) -> list[Message]:
    """Korean questions, Chinese and Japanese answers. SmolLM2's vocabulary spends about two
    tokens on a CJK character, so each text is a slice: two turns (~1,150 tokens) fit the 2,048
    window, as calibration needs. Every turn mixes the languages alike (Korean about 70% of the
    tokens): the estimate (cl100k x1.6) undercounts Korean by a fifth and Chinese and Japanese
    hardly at all, so every size starts about 15% low."""
    answers = [SAMPLES["chinese"], SAMPLES["japanese"]]
    messages: list[Message] = [{"role": "system", "content": "你是一个有帮助的助手。"}]
    for i in range(size):
        messages.append({"role": "user", "content": f"{i}. {_part(SAMPLES['korean'], i, 0.6)}"})
        messages.append({"role": "assistant", "content": _part(answers[i % 2], i + 1, 0.3)})
    messages.append({"role": "user", "content": "请用一句话回答。"})
    return messages


def json_data(size: int) -> list[Message]:
    data = json.loads(SAMPLES["data.json"])
    messages: list[Message] = [{"role": "system", "content": "You answer questions about JSON order data."}]
    for i in range(size):
        data["page"] = {
            "cursor": f"c{i:05d}",
            "total": 1000 + i * 37,
            "ids": [i * 7919 % 100003 + k for k in range(40)],
        }
        messages.append({"role": "user", "content": f"Page {i}:\n{json.dumps(data)}"})
        messages.append({"role": "assistant", "content": f"Page {i} has {len(data['results'])} orders."})
    messages.append({"role": "user", "content": "How many orders in total?"})
    return messages


def tools(size: int) -> list[Message]:
    messages: list[Message] = [{"role": "system", "content": "You look orders up with tools."}]
    for i in range(size):
        call_id = f"call_{i:04d}"
        messages.append({"role": "user", "content": f"Look up order batch {i}."})
        messages.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "lookup_orders", "arguments": json.dumps({"batch": i, "page": i % 5})},
                    }
                ],
            }
        )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": _cut(SAMPLES["data.json"], i, 0.9)})
        messages.append({"role": "assistant", "content": f"Batch {i} is found."})
    messages.append({"role": "user", "content": "Summarise in one word."})
    return messages


SYSTEM_RULES = 24  # ~1,400 tokens: a system prompt that takes most of a 2,048-token window, yet fits it


def large_system(size: int) -> list[Message]:
    """A large system prompt (the same at every size) that leaves little room for `size` turns of
    history. It fits the budget alone, so the guard can always answer by cutting history; a
    system prompt over the window by itself is refused unless `shrink_system` is allowed."""
    rules = (f"{k}. {_cut(SAMPLES['english'], k, 0.2)[:300]}" for k in range(SYSTEM_RULES))
    messages: list[Message] = [{"role": "system", "content": "Rules:\n" + "\n".join(rules)}]
    for i in range(size):
        messages.append({"role": "user", "content": f"Question {i}: {_cut(SAMPLES['english'], i)[:600]}"})
        messages.append({"role": "assistant", "content": f"Answer {i}: {_cut(SAMPLES['english'], i + 3)[:450]}"})
    messages.append({"role": "user", "content": "Say ok."})
    return messages


KINDS: dict[str, Callable[[int], list[Message]]] = {
    "english": english,
    "code": code,
    "cjk": cjk,
    "json": json_data,
    "tools": tools,
    "large_system": large_system,
}


def body(kind: str, size: int, model: str, stream: bool = False, max_tokens: int = 8) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": model,
        "messages": KINDS[kind](size),
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    if stream:
        request["stream"] = True
    return request


def over_window(model: str) -> list[tuple[str, dict[str, Any]]]:
    """18 requests over a 2,048-token window (2,300 to 12,000 tokens), each kind at two sizes,
    non-streaming and streaming, in an order that starts with streams (the hard case: nothing
    learned yet)."""
    cases: list[tuple[str, dict[str, Any]]] = []
    for stream in (True, False):
        for kind in KINDS:
            for size in (6, 14) if stream else (10,):
                cases.append((f"{kind}-{size}-{'stream' if stream else 'json'}", body(kind, size, model, stream)))
    return cases


def oversized_system(model: str) -> dict[str, Any]:
    """A system prompt over the 2,048-token window by itself (~2,900 tokens), then a question."""
    rules = "\n".join(f"{k}. {_cut(SAMPLES['english'], k, 0.2)[:300]}" for k in range(SYSTEM_RULES * 2))
    messages = [{"role": "system", "content": f"Rules:\n{rules}"}, {"role": "user", "content": "Say ok."}]
    return {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0}
