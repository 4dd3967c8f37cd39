"""Realistic synthetic conversations for the benchmarks: prose, code, JSON tool results and CJK,
built from the sample texts under tests/data/samples, every message distinct."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

SAMPLES = {
    p.stem: p.read_text(encoding="utf-8") for p in (Path(__file__).parent.parent / "tests/data/samples").glob("*.txt")
}


def agent_conversation(target_tokens: int, tokens_per_turn_estimate: int = 1000, repeat: int = 1) -> dict[str, Any]:
    """A system prompt, then turns of: user question, assistant tool call, JSON tool result,
    assistant answer (prose, code or CJK), until roughly `target_tokens`. `repeat` lengthens
    each tool result and answer that many times (about 1,000 tokens a turn at 1)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful engineering assistant.\n" + SAMPLES["english"]}
    ]
    cjk = [SAMPLES["chinese"], SAMPLES["japanese"], SAMPLES["korean"]]
    turns = max(1, target_tokens // tokens_per_turn_estimate)
    for i in range(turns):
        question = SAMPLES["english"][: 300 + i % 500] * repeat
        messages.append({"role": "user", "content": f"Request {i}: please look into item {i}.\n{question}"})
        call_id = f"call_{i:06d}"
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "lookup_orders", "arguments": json.dumps({"item": i, "page": i % 7})},
                    }
                ],
            }
        )
        result = json.loads(SAMPLES["data.json"])
        result["page"]["next_cursor"] = f"cursor-{i}"
        messages.append(
            {
                "role": "tool",
                "tool_call_id": call_id,
                "content": (json.dumps(result) + "\n" + SAMPLES["data.json"]) * repeat,
            }
        )
        answer = SAMPLES["code.py"] if i % 3 == 0 else (cjk[i % 3] if i % 3 == 1 else SAMPLES["english"])
        messages.append({"role": "assistant", "content": f"Finding {i}:\n" + answer * repeat})
    messages.append({"role": "user", "content": "Summarise everything above in five bullet points."})
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lookup_orders",
                "description": "Look up orders for an item.",
                "parameters": {
                    "type": "object",
                    "properties": {"item": {"type": "integer"}, "page": {"type": "integer"}},
                    "required": ["item"],
                },
            },
        }
    ]
    return {"model": "gpt-4.1", "messages": messages, "tools": tools}


def all_text(body: dict[str, Any]) -> str:
    """Every string a counter has to encode, concatenated: the raw-tiktoken baseline's input."""
    parts: list[str] = []
    for m in body["messages"]:
        if isinstance(m.get("content"), str):
            parts.append(m["content"])
        for call in m.get("tool_calls") or ():
            parts += [call["function"]["name"], call["function"]["arguments"]]
    return "\n".join(parts)


def random_conversation(rng: random.Random, turns: int = 12) -> dict[str, Any]:
    """An agent-style conversation: a system prompt, named users, content-part arrays, parallel
    tool calls with results in any order, some very long tool results, and sometimes a tool
    exchange still in progress after the latest user message."""
    texts = list(SAMPLES.values())

    def passage(lo: int, hi: int) -> str:
        source = rng.choice(texts)
        start = rng.randrange(0, max(1, len(source) - 50))
        return (source[start:] + "\n" + source)[: rng.randint(lo, hi)]

    def user() -> dict[str, Any]:
        message: dict[str, Any] = {"role": "user", "content": passage(40, 600)}
        if rng.random() < 0.3:
            message["content"] = [
                {"type": "text", "text": passage(40, 400)},
                {"type": "text", "text": passage(40, 200)},
            ]
        if rng.random() < 0.2:
            message["name"] = rng.choice(["ana", "bo"])
        return message

    def exchange(tag: str) -> list[dict[str, Any]]:
        ids = [f"call_{tag}_{i}" for i in range(rng.randint(1, 3))]
        calls = [
            {"id": i, "type": "function", "function": {"name": "search", "arguments": json.dumps({"q": tag})}}
            for i in ids
        ]
        results = [
            {"role": "tool", "tool_call_id": i, "content": passage(200, 12000 if rng.random() < 0.3 else 1500)}
            for i in ids
        ]
        rng.shuffle(results)
        return [{"role": "assistant", "content": None, "tool_calls": calls}, *results]

    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a research agent. " + passage(100, 800)}]
    for t in range(rng.randint(turns // 2, turns)):
        messages.append(user())
        for k in range(rng.choice([0, 0, 1, 2])):
            messages += exchange(f"{t}_{k}")
        messages.append({"role": "assistant", "content": passage(100, 2500)})
    messages.append(user())
    if rng.random() < 0.25:
        messages += exchange("live")
    return {"model": "gpt-4o", "messages": messages}


# Characters per o200k token in each sample, measured once: long passages are cut to a token size
# by their length in characters, so that generating a conversation needs no tokenizer.
CHARS_PER_TOKEN = {"english": 5.6, "code.py": 4.1, "data.json": 2.4, "chinese": 1.5, "japanese": 1.2, "korean": 1.7}
GROWING_KINDS = ("chat", "agent", "cjk", "images")


def passage_of(rng: random.Random, sources: tuple[str, ...], tokens: int) -> str:
    """About `tokens` tokens of text drawn from the named samples, starting anywhere in them."""
    source = rng.choice(sources)
    text = SAMPLES[source]
    start = rng.randrange(len(text))
    wanted = int(tokens * CHARS_PER_TOKEN[source])
    rotated = text[start:] + "\n" + text[:start]
    return (rotated * (wanted // len(rotated) + 1))[:wanted]


def _png_data_url(width: int, height: int) -> str:
    """A data URL whose bytes start like a real PNG of that size (the counter reads only the header)."""
    import base64
    import struct

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + b"\0\0\0\0" + b"\0" * 64
    return "data:image/png;base64," + base64.b64encode(data).decode()


LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "search_repository",
        "description": "Search the repository and return matching files and records.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
            "required": ["query"],
        },
    },
}


def growing_conversation(kind: str, rng: random.Random, total_tokens: int) -> list[dict[str, Any]]:
    """The successive request bodies of one conversation that grows to about `total_tokens`, as a
    client re-sends it: each body holds every earlier message plus the newest input. Kinds:

    - chat: English prose and code, questions of 20-250 tokens, answers of 80-700;
    - agent: each user turn runs one to three tool steps (one or two parallel calls, results of
      150-1,200 tokens, and one in five of 2,000-4,000), and a request is sent after every step;
    - cjk: as chat, in Chinese, Japanese and Korean;
    - images: as chat, half the questions carrying a screenshot or photo (some `detail: low`).
    """
    if kind not in GROWING_KINDS:
        raise ValueError(f"unknown conversation kind {kind!r}; known: {', '.join(GROWING_KINDS)}")
    prose: tuple[str, ...] = ("chinese", "japanese", "korean") if kind == "cjk" else ("english", "code.py")
    system = {"role": "system", "content": "You are a careful assistant.\n" + passage_of(rng, ("english",), 250)}
    messages: list[dict[str, Any]] = [system]
    bodies: list[dict[str, Any]] = []
    tokens = 250

    def send() -> None:
        body: dict[str, Any] = {"model": "gpt-4o", "messages": list(messages)}
        if kind == "agent":
            body["tools"] = [LOOKUP_TOOL]
        bodies.append(body)

    turn = 0
    while tokens < total_tokens:
        size = rng.randint(20, 250)
        question: dict[str, Any] = {"role": "user", "content": f"[{turn}] " + passage_of(rng, prose, size)}
        if kind == "images" and rng.random() < 0.5:
            width, height = rng.choice([(1920, 1080), (1024, 768), (512, 512), (1280, 2400)])
            image: dict[str, Any] = {"url": _png_data_url(width, height)}
            if rng.random() < 0.3:
                image["detail"] = "low"
            question["content"] = [
                {"type": "text", "text": question["content"]},
                {"type": "image_url", "image_url": image},
            ]
            size += 600
        messages.append(question)
        tokens += size
        send()
        if kind == "agent":
            for step in range(rng.randint(1, 3)):
                ids = [f"call_{turn}_{step}_{k}" for k in range(rng.choice((1, 1, 2)))]
                messages.append(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": i,
                                "type": "function",
                                "function": {"name": "search_repository", "arguments": json.dumps({"query": i})},
                            }
                            for i in ids
                        ],
                    }
                )
                for i in ids:
                    size = rng.randint(2000, 4000) if rng.random() < 0.2 else rng.randint(150, 1200)
                    sources = ("data.json", "code.py")
                    messages.append({"role": "tool", "tool_call_id": i, "content": passage_of(rng, sources, size)})
                    tokens += size
                send()
        size = rng.randint(80, 700 if kind != "agent" else 500)
        messages.append({"role": "assistant", "content": f"[{turn}] " + passage_of(rng, prose, size)})
        tokens += size
        turn += 1
    return bodies
