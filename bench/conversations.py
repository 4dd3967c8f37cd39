"""Realistic synthetic conversations for the benchmarks: prose, code, JSON tool results and CJK,
built from the sample texts under tests/data/samples, every message distinct."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SAMPLES = {p.stem: p.read_text(encoding="utf-8") for p in (Path(__file__).parent.parent / "tests/data/samples").glob("*.txt")}


def agent_conversation(target_tokens: int, tokens_per_turn_estimate: int = 1000) -> dict[str, Any]:
    """A system prompt, then turns of: user question, assistant tool call, JSON tool result,
    assistant answer (prose, code or CJK), until roughly `target_tokens`."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a careful engineering assistant.\n" + SAMPLES["english"]}]
    cjk = [SAMPLES["chinese"], SAMPLES["japanese"], SAMPLES["korean"]]
    turns = max(1, target_tokens // tokens_per_turn_estimate)
    for i in range(turns):
        messages.append({"role": "user", "content": f"Request {i}: please look into item {i}.\n{SAMPLES['english'][: 300 + i % 500]}"})
        call_id = f"call_{i:06d}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "lookup_orders", "arguments": json.dumps({"item": i, "page": i % 7})}}]})
        result = json.loads(SAMPLES["data.json"])
        result["page"]["next_cursor"] = f"cursor-{i}"
        messages.append({"role": "tool", "tool_call_id": call_id, "content": json.dumps(result) + "\n" + SAMPLES["data.json"]})
        answer = SAMPLES["code.py"] if i % 3 == 0 else (cjk[i % 3] if i % 3 == 1 else SAMPLES["english"])
        messages.append({"role": "assistant", "content": f"Finding {i}:\n{answer}"})
    messages.append({"role": "user", "content": "Summarise everything above in five bullet points."})
    tools = [{"type": "function", "function": {"name": "lookup_orders", "description": "Look up orders for an item.",
              "parameters": {"type": "object", "properties": {"item": {"type": "integer"}, "page": {"type": "integer"}}, "required": ["item"]}}}]
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
