"""The cost of the API adapters: one large agent conversation in each shape, cut to gpt-4o's window.

The same ~1M-token conversation (bench/conversations.py) is written as chat completions, as
OpenAI Responses items and as Anthropic Messages, then parsed, counted and trimmed by the core,
and written back. Reported per shape: parse, count + trim (the core), render, and the adapter's
share (parse + render) of the whole. Each figure is the best of `--runs`, with a cold count
cache, so that the core's cost is what it is on a first request.

Run: python bench/adapters.py [--tokens N] [--runs R]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent))

from bench.conversations import agent_conversation
from proxy.apis.anthropic.messages import MessagesAdapter
from proxy.apis.base import Adapter
from proxy.apis.openai.chat import ChatAdapter
from proxy.apis.openai.responses import ResponsesAdapter
from proxy.core.counting.count_cache import CountCache
from proxy.core.counting.request_count import RequestCounter
from proxy.core.models.model_registry import ModelRegistry
from proxy.core.plan import TrimPolicy, plan_request
from proxy.tokenizers.model_map import load_model_map
from proxy.tokenizers.vocabularies import Tokenizers


def as_responses(chat: dict[str, Any]) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    instructions = None
    for m in chat["messages"]:
        if m["role"] == "system":
            instructions = m["content"]
        elif m["role"] == "tool":
            items.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        elif m.get("tool_calls"):
            for c in m["tool_calls"]:
                f = c["function"]
                items.append(
                    {"type": "function_call", "call_id": c["id"], "name": f["name"], "arguments": f["arguments"]}
                )
        elif m["role"] == "assistant":
            items.append(
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": m["content"]}]}
            )
        else:
            items.append({"role": "user", "content": [{"type": "input_text", "text": m["content"]}]})
    tools = [{"type": "function", **t["function"]} for t in chat.get("tools", [])]
    return {"model": chat["model"], "instructions": instructions, "input": items, "tools": tools}


def as_messages(chat: dict[str, Any]) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    system = None
    for m in chat["messages"]:
        if m["role"] == "system":
            system = m["content"]
        elif m["role"] == "tool":
            result = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            messages.append({"role": "user", "content": [result]})
        elif m.get("tool_calls"):
            uses = [
                {
                    "type": "tool_use",
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "input": json.loads(c["function"]["arguments"]),
                }
                for c in m["tool_calls"]
            ]
            messages.append({"role": "assistant", "content": uses})
        else:
            messages.append({"role": m["role"], "content": m["content"]})
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "input_schema": t["function"]["parameters"],
        }
        for t in chat.get("tools", [])
    ]
    return {"model": chat["model"], "max_tokens": 4096, "system": system, "messages": messages, "tools": tools}


def measure(adapter: Adapter, body: dict[str, Any], runs: int) -> dict[str, float]:
    registry = ModelRegistry(load_model_map())
    profile = registry.profile("gpt-4o")
    tokenizer = Tokenizers().get(profile.tokenizer)
    best: dict[str, float] = {}
    for _ in range(runs):
        t0 = time.perf_counter()
        parsed = adapter.parse(body)
        t1 = time.perf_counter()
        counter = RequestCounter(adapter.profile(profile, parsed), tokenizer, CountCache())
        plan = plan_request(parsed.chat, counter, TrimPolicy())
        t2 = time.perf_counter()
        adapter.render(parsed, plan.result.body, plan.result.removals)
        t3 = time.perf_counter()
        for key, value in (("parse", t1 - t0), ("core", t2 - t1), ("render", t3 - t2)):
            best[key] = min(best.get(key, value), value)
        best["tokens_before"], best["tokens_after"] = plan.result.tokens_before, plan.result.tokens_after
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    chat = agent_conversation(args.tokens)
    chat["model"] = "gpt-4o"
    shapes = (
        ("chat", ChatAdapter(), chat),
        ("responses", ResponsesAdapter(), as_responses(chat)),
        ("messages", MessagesAdapter(), as_messages(chat)),
    )
    print(f"{'shape':<10} {'tokens':>17} {'parse ms':>9} {'core ms':>8} {'render ms':>9} {'adapter share':>13}")
    for name, adapter, body in shapes:
        m = measure(adapter, body, args.runs)
        share = (m["parse"] + m["render"]) / (m["parse"] + m["core"] + m["render"])
        tokens = f"{int(m['tokens_before']):,} -> {int(m['tokens_after']):,}"
        print(
            f"{name:<10} {tokens:>17} {m['parse'] * 1000:9.1f} {m['core'] * 1000:8.1f} "
            f"{m['render'] * 1000:9.1f} {share:13.1%}"
        )


if __name__ == "__main__":
    main()
