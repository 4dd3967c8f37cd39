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
