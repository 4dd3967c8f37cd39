"""A scripted model for the agent CLIs (Claude Code, Codex CLI): the recording upstream, answering
the agent loop's requests with one shell tool call per step (`cat` of a real file of the repo,
14-24 KB each) for `steps` steps, then a final text answer. Requests outside the loop (a title, a
quota check: no shell tool offered) are answered "ok". The answers are the recording upstream's
(Anthropic Messages and Responses, streamed as each API does).

It also counts what reached it, independently of the guard: every forwarded body's texts with
tiktoken directly (`independent_tokens`), so a test can check each against the budget.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from proxy.demo.provider_answers import Answer, ToolCall
from tests.compat.recording_upstream import RecordingUpstream
from tests.compat.threaded_guard import guard_in_thread
from tests.support.cookbook import encoding as cookbook_encoding

ROOT = Path(__file__).resolve().parents[2]
FINAL_ANSWER = "All thirty files are read: the loop is complete."
# The shell tool each CLI offers, and how a call of it is written.
SHELLS = {"Bash": "claude", "shell": "codex", "exec_command": "codex", "shell_command": "codex"}


def step_files(count: int, low: int = 14_000, high: int = 24_000) -> list[Path]:
    """`count` real files of the repository of `low` to `high` bytes, repeated in order if there
    are fewer (sorted, so every run reads the same)."""
    found = sorted(p for p in ROOT.glob("proxy/**/*.py") if low <= p.stat().st_size <= high)
    found += sorted(p for p in ROOT.glob("docs/*.md") if low <= p.stat().st_size <= high)
    assert found, "no file of the wanted size in the repository"
    return [found[i % len(found)] for i in range(count)]


def independent_tokens(body: dict[str, Any]) -> int:
    """Every string in `body` (instructions, messages, tool results, tool schemas) counted with
    o200k_base directly, keys and structure left out: what the guard's count must exceed or match
    for a body it let through to be within its budget (its Claude estimate errs high)."""
    encoding = cookbook_encoding("gpt-5.5")  # o200k_base, read from litellm's copy: no download
    texts: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                if key not in ("model", "type", "id", "call_id", "tool_use_id", "signature", "cache_control"):
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk({k: v for k, v in body.items() if k in ("system", "messages", "instructions", "input", "tools")})
    return sum(len(encoding.encode(text, disallowed_special=())) for text in texts)


@dataclass
class AgentModel(RecordingUpstream):
    steps: int = 30
    files: list[Path] = field(default_factory=list)
    calls: int = 0  # shell calls answered so far
    compactions: int = 0  # requests asking for a summary of the conversation (Claude Code's /compact)
    loop_bodies: list[dict[str, Any]] = field(default_factory=list)  # the loop's requests as forwarded

    def reset(self) -> None:
        super().reset()
        self.calls = self.compactions = 0
        self.loop_bodies.clear()
        self.files = step_files(self.steps)

    def _answer(self, body: dict[str, Any]) -> Answer:
        names = [t.get("name") for t in body.get("tools") or () if isinstance(t, dict)]
        shell = next((n for n in names if n in SHELLS), None)
        if shell is None:
            return "ok"
        if _asks_for_a_summary(body):  # the client compacting its history: a summary, not a step
            self.compactions += 1
            return "Summary: the files were read one by one with the shell; the task goes on."
        self.loop_bodies.append(body)
        if self.calls >= self.steps:
            return FINAL_ANSWER
        path = self.files[self.calls]
        self.calls += 1
        command = f"cat {path}"
        if shell == "Bash":
            return ToolCall(shell, json.dumps({"command": command, "description": f"Read {path.name}"}))
        if shell == "exec_command":
            return ToolCall(shell, json.dumps({"cmd": command}))
        if shell == "shell_command":
            return ToolCall(shell, json.dumps({"command": command}))
        return ToolCall(shell, json.dumps({"command": ["bash", "-lc", command]}))


@dataclass
class Served:
    model: AgentModel
    root: str  # the guard's root URL
    logs: io.StringIO  # where the suite's logging writes (the `servers` fixture configured it)
    seen: int  # its lines before this guard started

    def log_events(self) -> list[dict[str, Any]]:
        lines = self.logs.getvalue().splitlines()[self.seen :]
        return [e for e in map(json.loads, filter(None, lines)) if e.get("event") == "request"]


@contextmanager
def guarded(model: AgentModel, window: int, models: tuple[str, ...], logs: io.StringIO) -> Iterator[Served]:
    """`model` behind a guard that gives `models` a `window`-token window, both served on loopback
    from one background thread (the CLIs run in subprocesses); the guard's log lines go to `logs`,
    the stream the suite's logging was configured with."""
    seen = len(logs.getvalue().splitlines())
    with guard_in_thread(model.app(), window, models, read_timeout=60) as url:
        model.reset()
        yield Served(model, url, logs, seen)


def _asks_for_a_summary(body: dict[str, Any]) -> bool:
    """Whether the latest user message asks for a summary of the conversation so far."""
    messages = body.get("messages") or []
    last = messages[-1] if messages else {}
    content = last.get("content") if isinstance(last, dict) else None
    blocks = [content] if isinstance(content, str) else content if isinstance(content, list) else []
    texts = [b if isinstance(b, str) else b.get("text") for b in blocks if isinstance(b, str | dict)]
    return any(isinstance(t, str) and "summary of the conversation" in t.lower() for t in texts)
