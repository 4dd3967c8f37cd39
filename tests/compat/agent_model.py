"""A scripted model for the agent CLIs (Claude Code, Codex CLI): the recording upstream, answering
the agent loop's requests with one shell tool call per step (`cat` of real files of the repo,
14-24 KB each, `files_per_step` of them) for `steps` steps, then a final text answer. Requests
outside the loop (a title, a quota check: no shell tool offered) are answered "ok".

It answers as the provider would in what the CLIs act on: every Messages and Responses answer
reports the request's input tokens (counted independently, below), so a CLI decides to compact on
the numbers it would see from the real API; a client's compaction request (Claude Code's summary
prompt, Codex's `compaction_trigger` or its checkpoint prompt) is answered with a summary (a
compaction item for the trigger); with `reasoning`, each Responses answer to a request that asks
for reasoning opens with an encrypted reasoning item, which Codex sends back (`store: false`).

It also counts what reached it, independently of the guard: every forwarded body's texts with
tiktoken directly (`independent_tokens`), so a test can check each against the budget.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from proxy.demo import provider_answers as answers
from proxy.demo.provider_answers import Answer, ToolCall
from tests.compat.agent_answers import SUMMARY, compaction_item, reasoning_item, response_stream
from tests.compat.recording_upstream import Received, RecordingUpstream
from tests.compat.threaded_guard import guard_in_thread
from tests.support.cookbook import encoding as cookbook_encoding

ROOT = Path(__file__).resolve().parents[2]
FINAL_ANSWER = "All the files are read: the loop is complete."
# The shell tool each CLI offers, and how a call of it is written.
SHELLS = {"Bash": "claude", "shell": "codex", "exec_command": "codex", "shell_command": "codex"}
# What the CLIs' compaction prompts say, as read in their packages (written here, not taken from
# the guard, which recognises them with its own list).
SUMMARY_PROMPTS = ("create a detailed summary of", "context checkpoint compaction")
OUTPUT_TOKENS = 40  # what every answer reports as its output


def step_files(count: int, folder: Path | None = None, low: int = 14_000, high: int = 24_000) -> list[Path]:
    """`count` real files of the repository of `low` to `high` bytes (or every file of `folder`),
    repeated in order if there are fewer (sorted, so every run reads the same)."""
    if folder is not None:
        found = sorted(p for p in folder.iterdir() if p.is_file())
        return [found[i % len(found)] for i in range(count)]
    found = sorted(p for p in ROOT.glob("proxy/**/*.py") if low <= p.stat().st_size <= high)
    found += sorted(p for p in ROOT.glob("docs/*.md") if low <= p.stat().st_size <= high)
    assert found, "no file of the wanted size in the repository"
    return [found[i % len(found)] for i in range(count)]


def independent_tokens(body: dict[str, Any]) -> int:
    """Every string in `body` (instructions, messages, tool results, tool schemas) counted with
    o200k_base directly, keys and structure left out: what the guard's count must exceed or match
    for a body it let through to be within its budget (its Claude estimate errs high). Encrypted
    content is left out too: a ciphertext the provider decrypts, which stands for a number of
    tokens no client can know."""
    encoding = cookbook_encoding("gpt-5.5")  # o200k_base, read from litellm's copy: no download
    texts: list[str] = []
    skipped = ("model", "type", "id", "call_id", "tool_use_id", "signature", "cache_control", "encrypted_content")

    def walk(value: Any) -> None:
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, dict):
            for key, item in value.items():
                if key not in skipped:
                    walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk({k: v for k, v in body.items() if k in ("system", "messages", "instructions", "input", "tools")})
    return sum(len(encoding.encode(text, disallowed_special=())) for text in texts)


@dataclass
class AgentModel(RecordingUpstream):
    steps: int = 30
    files_per_step: int = 1  # files each shell call prints
    reasoning: bool = False  # Responses answers open with an encrypted reasoning item
    folder: Path | None = None  # where the files to print are, when not the repository's
    files: list[list[Path]] = field(default_factory=list)  # what each step prints
    calls: int = 0  # shell calls answered so far
    compactions: list[dict[str, Any]] = field(default_factory=list)  # the compaction requests as forwarded
    loop_bodies: list[dict[str, Any]] = field(default_factory=list)  # the loop's requests as forwarded

    def reset(self) -> None:
        super().reset()
        self.calls = 0
        self.compactions.clear()
        self.loop_bodies.clear()
        flat = step_files(self.steps * self.files_per_step, self.folder)
        self.files = [flat[k : k + self.files_per_step] for k in range(0, len(flat), self.files_per_step)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path.rstrip("/")
        if not path.endswith(("/responses", "/messages")):
            return await super().handle(request)
        raw = await request.read()
        body = json.loads(raw) if raw else {}
        self.received.append(Received(request.path, dict(request.headers), body))
        ids, model, stream = f"rec{len(self.received)}", body.get("model"), bool(body.get("stream"))
        usage = answers.Usage(input=independent_tokens(body), output=OUTPUT_TOKENS)
        if path.endswith("/messages"):
            message = answers.anthropic_message(model, self._answer(body), ids=ids, usage=usage)
            if not stream:
                return web.json_response(message)
            text = message["content"][0].get("text")
            events = answers.anthropic_events(message, pieces=answers.words(text) if text else None)
            return await self._stream(request, answers.frames(events))
        items = self._output(body, ids)
        fields = {"ids": ids, "created": int(time.time()), "usage": usage, "every_field": True}
        fields["previous_response_id"] = body.get("previous_response_id")
        if not stream:
            return web.json_response(answers.response(model, items, **fields))
        return await self._stream(request, answers.frames(response_stream(model, items, **fields)))

    def _output(self, body: dict[str, Any], ids: str) -> list[dict[str, Any]]:
        """A Responses answer's output items."""
        items = body.get("input") if isinstance(body.get("input"), list) else []
        if items and isinstance(items[-1], dict) and items[-1].get("type") == "compaction_trigger":
            self.compactions.append(body)
            return [compaction_item(ids)]
        item = answers.response_item(self._answer(body), ids=ids)
        return [reasoning_item(ids), item] if self.reasoning and body.get("reasoning") else [item]

    def _answer(self, body: dict[str, Any]) -> Answer:
        if _asks_for_a_summary(body):  # the client compacting its history: a summary, not a step
            self.compactions.append(body)
            return f"<analysis>The files were read.</analysis>\n<summary>{SUMMARY}</summary>"
        names = [t.get("name") for t in body.get("tools") or () if isinstance(t, dict)]
        shell = next((n for n in names if n in SHELLS), None)
        if shell is None:
            return "ok"
        self.loop_bodies.append(body)
        if self.calls >= self.steps:
            return FINAL_ANSWER
        paths = self.files[self.calls]
        self.calls += 1
        command = "cat " + " ".join(str(p) for p in paths)
        if shell == "Bash":
            return ToolCall(shell, json.dumps({"command": command, "description": f"Read {paths[0].name}"}))
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
    """Whether the latest user message (Messages, or Responses input) asks for a summary of the
    conversation so far, in the words of a CLI's compaction prompt."""
    messages = body.get("messages") or body.get("input") or []
    users = (
        [m for m in messages if isinstance(m, dict) and m.get("role") == "user"] if isinstance(messages, list) else []
    )
    content = users[-1].get("content") if users else None
    blocks = [content] if isinstance(content, str) else content if isinstance(content, list) else []
    texts = [b if isinstance(b, str) else b.get("text") for b in blocks if isinstance(b, str | dict)]
    return any(isinstance(t, str) and any(p in t.lower() for p in SUMMARY_PROMPTS) for t in texts)
