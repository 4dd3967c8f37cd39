"""Agent tool loops made of real content: one prompt, then tool calls whose results are slices of
the Python standard library's own source files, read when the test runs (a real file is what a
coding agent reads; no generated filler). Each loop is written in the three shapes the guard
trims: chat completions, OpenAI Responses items and Anthropic Messages blocks.

Slice sizes are drawn log-uniformly between a low and a high token count (o200k_base, with
tiktoken directly), seeded, so a loop is the same on every run of one Python version.
"""

from __future__ import annotations

import json
import random
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tests.support.cookbook import encoding

PROMPT = (
    "The tokenizer in our service miscounts some requests. Read the relevant standard library modules "
    "one by one, note what each does with text, and tell me where a count could go wrong."
)


@dataclass(frozen=True)
class Step:
    """One tool call and its result."""

    call_id: str
    tool: str
    arguments: dict[str, Any]
    result: str


@cache
def _sources() -> tuple[Path, ...]:
    return tuple(sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")))


def file_slices(count: int, seed: int, low: int = 400, high: int = 4000) -> list[tuple[str, int, str]]:
    """`count` slices of standard library files, each (file name, first line, text) of about
    `low`..`high` tokens."""
    enc = encoding("gpt-4o")
    rng = random.Random(seed)
    out: list[tuple[str, int, str]] = []
    while len(out) < count:
        target = int(low * (high / low) ** rng.random())
        # A file long enough for the size drawn (about 4 bytes a token), so sizes stay as drawn.
        path = rng.choice([p for p in _sources() if p.stat().st_size >= 5 * target] or list(_sources()))
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        start = rng.randrange(max(1, len(lines) // 2))
        taken: list[str] = []
        tokens = 0
        for line in lines[start:]:
            if tokens + len(enc.encode(line)) + 1 > target and tokens >= low:
                break
            taken.append(line)
            tokens += len(enc.encode(line)) + 1
        if low <= tokens <= high:
            out.append((path.name, start + 1, "\n".join(taken)))
    return out


def agent_steps(count: int, seed: int = 1, low: int = 400, high: int = 4000) -> list[Step]:
    """`count` `read_file` calls of an agent, each answered by a slice of a real file."""
    return [
        Step(f"call_{seed}_{k}", "read_file", {"path": name, "start_line": line}, text)
        for k, (name, line, text) in enumerate(file_slices(count, seed, low, high))
    ]


SYSTEM = "You are a coding agent. Use the tools to read files; answer when you know."
CHAT_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file from line start_line on",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "start_line": {"type": "integer"}},
            "required": ["path"],
        },
    },
}
RESPONSES_TOOL = {"type": "function", **CHAT_TOOL["function"]}
ANTHROPIC_TOOL = {
    "name": "read_file",
    "description": CHAT_TOOL["function"]["description"],
    "input_schema": CHAT_TOOL["function"]["parameters"],
}


def chat_messages(steps: Sequence[Step], prompt: str = PROMPT) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    for step in steps:
        call = {"id": step.call_id, "type": "function", "function": {"name": step.tool, "arguments": _args(step)}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": step.call_id, "content": step.result})
    return messages


def responses_input(steps: Sequence[Step], prompt: str = PROMPT) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for step in steps:
        items.append({"type": "function_call", "call_id": step.call_id, "name": step.tool, "arguments": _args(step)})
        items.append({"type": "function_call_output", "call_id": step.call_id, "output": step.result})
    return items


def anthropic_messages(steps: Sequence[Step], prompt: str = PROMPT, thinking: bool = False) -> list[dict[str, Any]]:
    """The loop as Anthropic Messages; with `thinking`, each tool_use is preceded by a (signed)
    thinking block, as Claude sends them with extended thinking on."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for k, step in enumerate(steps):
        blocks: list[dict[str, Any]] = []
        if thinking:
            blocks.append(
                {"type": "thinking", "thinking": f"Next I read {step.arguments['path']}.", "signature": f"s{k}"}
            )
        blocks.append({"type": "tool_use", "id": step.call_id, "name": step.tool, "input": step.arguments})
        messages.append({"role": "assistant", "content": blocks})
        result = {"type": "tool_result", "tool_use_id": step.call_id, "content": step.result}
        messages.append({"role": "user", "content": [result]})
    return messages


def _args(step: Step) -> str:
    return json.dumps(step.arguments)
