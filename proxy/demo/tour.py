"""`context-guard demo`: a real trim, seen in one command, with no API key and no network.

It starts, in this one process and on free loopback ports, the built-in echo upstream
(`proxy.demo.echo`, which calls no model and answers with what reached it) and the guard in
front of it, with three models given a small window. It then sends seven requests through the guard:
with the official `openai` SDK, a short chat that fits; an agent conversation whose large tool
result cannot fit; the same conversation one turn later; and that one again, streamed; then, with
the official `anthropic` SDK (plain HTTP where it is not installed), that conversation as
Anthropic Messages to a Claude model; as Gemini's generateContent to a Gemini model, on the
Developer API's path; and as an interaction with that model (Google's Interactions API). For each
it prints a short before/after table, built from the guard's
`x-context-guard-*` headers, its log event and the echo's account of what arrived, followed by the
guard's real log line.

It exits 0 when every request was answered and every forwarded conversation fitted its budget
and arrived valid; 1, saying what went wrong, otherwise. Both servers are stopped before it returns.
"""

from __future__ import annotations

import asyncio
import io
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from aiohttp import web

from proxy.config.settings import Settings, settings_from_dict
from proxy.demo.anthropic_request import sdk_installed, send_messages
from proxy.demo.echo import running_echo, with_echo_upstream
from proxy.demo.native_shapes import GEMINI, as_anthropic, send_gemini, send_interaction
from proxy.logging import configure_logging
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app

MODEL = "gpt-4o-mini"
CLAUDE = "claude-sonnet-4-6"
WINDOW = 4096  # as small as a laptop's local model: the agent conversation below cannot fit
LOG_WAIT_SECONDS = 5.0
REQUEST_TIMEOUT_SECONDS = 60.0


def demo_settings(echo_url: str) -> Settings:
    """The demo's settings: the built-in defaults, with `MODEL` given a `WINDOW`-token window, JSON
    logs, and every request routed to the echo upstream at `echo_url`."""
    data = {
        "server": {"host": "127.0.0.1", "port": 0},
        "log": {"format": "json", "level": "info"},
        "models": {"overrides": [{"match": m, "context_window": WINDOW} for m in (MODEL, CLAUDE, GEMINI)]},
    }
    return with_echo_upstream(settings_from_dict(data, "<demo>", {}), echo_url)


@dataclass(frozen=True)
class Step:
    title: str
    messages: list[dict[str, Any]]
    stream: bool = False
    anthropic: bool = False  # sent with the anthropic SDK, as Messages to `CLAUDE`
    gemini: bool = False  # sent as Gemini's generateContent to `GEMINI` (`proxy.demo.native_shapes`)
    interaction: bool = False  # sent as an interaction with `GEMINI` (Google's Interactions API)


@dataclass
class Seen:
    """One request of the demo as the client, the guard's log and the echo upstream saw it."""

    step: Step
    request_id: str
    status: int
    headers: dict[str, str]
    reply: str
    echo: dict[str, Any] | None
    usage: dict[str, Any] | None
    log_line: str = ""
    log: dict[str, Any] = field(default_factory=dict)

    @property
    def removed(self) -> list[dict[str, Any]]:
        return list(self.log.get("removed") or [])

    def problems(self) -> list[str]:
        """Why this request does not show what the demo promises; empty when all is well."""
        problems = []
        if self.status != 200 or self.echo is None:
            problems.append(f"not answered by the echo upstream (status {self.status})")
            return problems
        budget = int(self.headers.get("x-context-guard-budget", 0))
        if self.echo["prompt_tokens"] > budget:
            problems.append(f"{self.echo['prompt_tokens']} tokens arrived upstream; the budget is {budget}")
        if not self.echo["valid"]:
            problems.append(f"arrived invalid: {'; '.join(self.echo['problems'])}")
        if not self.log:
            problems.append("the guard logged no event for it")
        return problems


def run_demo(out: TextIO) -> int:
    return asyncio.run(_run(out))


async def _run(out: TextIO) -> int:
    from openai import AsyncOpenAI

    log_stream = io.StringIO()
    configure_logging("json", "info", stream=log_stream)
    async with running_echo() as echo_url:
        settings = demo_settings(echo_url)
        runner = web.AppRunner(create_app(settings, Models(settings)), access_log=None, handler_cancellation=True)
        await runner.setup()
        try:
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            guard_url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
            _intro(out, guard_url, echo_url)
            client = AsyncOpenAI(
                base_url=guard_url, api_key="no-key-needed", max_retries=0, timeout=REQUEST_TIMEOUT_SECONDS
            )
            seen: list[Seen] = []
            async with client:
                for number, step in enumerate(steps(), start=1):
                    request_id = f"demo-{number}"
                    if step.gemini or step.interaction:
                        send = send_gemini if step.gemini else send_interaction
                        sent = await send(guard_url.removesuffix("/v1"), step.messages, TOOLS, request_id)
                        one = Seen(step, request_id, *sent)
                    elif step.anthropic:
                        one = await _send_anthropic(guard_url.removesuffix("/v1"), step, request_id)
                    else:
                        one = await _send(client, step, request_id)
                    await _attach_log(one, log_stream)
                    seen.append(one)
                    _show(out, number, one, seen[1] if number == 3 else None)
        finally:
            await runner.cleanup()
    return _verdict(out, seen)


def _intro(out: TextIO, guard_url: str, echo_url: str) -> None:
    out.write(
        f"context-guard demo: the guard at {guard_url}, in front of the built-in echo upstream at {echo_url}\n"
        f"(a testing aid that calls no model and answers with what reached it). {MODEL}'s window is set to "
        f"{WINDOW:,} tokens.\n"
    )


async def _send(client: Any, step: Step, request_id: str) -> Seen:
    from openai import APIConnectionError, APIStatusError

    args: dict[str, Any] = {"model": MODEL, "messages": step.messages, "tools": TOOLS}
    headers = {"x-request-id": request_id}
    try:
        if not step.stream:
            raw = await client.chat.completions.with_raw_response.create(**args, extra_headers=headers)
            completion = raw.parse()
            extra = completion.model_extra or {}
            usage = completion.usage.model_dump() if completion.usage else None
            reply = completion.choices[0].message.content or ""
            return Seen(step, request_id, raw.status_code, dict(raw.headers), reply, extra.get("echo"), usage)
        raw = await client.chat.completions.with_raw_response.create(
            **args, stream=True, stream_options={"include_usage": True}, extra_headers=headers
        )
        parts: list[str] = []
        echo = usage = None
        async for chunk in raw.parse():
            parts += [c.delta.content for c in chunk.choices if c.delta.content]
            echo = (chunk.model_extra or {}).get("echo") or echo
            usage = chunk.usage.model_dump() if chunk.usage else usage
        return Seen(step, request_id, raw.status_code, dict(raw.headers), "".join(parts), echo, usage)
    except APIStatusError as exc:
        return Seen(step, request_id, exc.status_code, dict(exc.response.headers), exc.message, None, None)
    except APIConnectionError as exc:  # reported as unanswered, and the demo exits 1
        return Seen(step, request_id, 0, {}, str(exc), None, None)


async def _send_anthropic(guard_root: str, step: Step, request_id: str) -> Seen:
    """`step` as Anthropic Messages to the guard's root (proxy.demo.anthropic_request says with which client)."""
    system, messages = as_anthropic(step.messages)
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in TOOLS
    ]
    body = {"model": CLAUDE, "max_tokens": 512, "system": system, "messages": messages, "tools": tools}
    a = await send_messages(guard_root, body, request_id, REQUEST_TIMEOUT_SECONDS)
    return Seen(step, request_id, a.status, a.headers, a.reply, a.echo, a.usage)


async def _attach_log(seen: Seen, log_stream: io.StringIO) -> None:
    """The guard's `request` event for this request. A stream's event is written just after its
    last byte, so it may be a moment behind the client; wait for it, boundedly."""
    deadline = time.monotonic() + LOG_WAIT_SECONDS
    while True:
        for line in log_stream.getvalue().splitlines():
            event = json.loads(line)
            if event.get("event") == "request" and event.get("request_id") == seen.request_id:
                seen.log_line, seen.log = line, event
                return
        if time.monotonic() > deadline:
            return
        await asyncio.sleep(0.01)


def _show(out: TextIO, number: int, seen: Seen, previous: Seen | None) -> None:
    h = seen.headers
    out.write(f"\n{number}. {seen.step.title}\n")
    if seen.echo is None:
        out.write(f"   NOT ANSWERED: status {seen.status}: {seen.reply}\n")
    lines = _removed_lines(seen.removed) or ["nothing"]
    before, after, budget = (_n(h.get(f"x-context-guard-{k}")) for k in ("tokens-before", "tokens-after", "budget"))
    out.write(f"   {'tokens before':>13}  {'tokens after':>12}  {'budget':>6}  removed (by strategy)\n")
    out.write(f"   {before:>13}  {after:>12}  {budget:>6}  {lines[0]}\n")
    for line in lines[1:]:
        out.write(f"   {'':>13}  {'':>12}  {'':>6}  {line}\n")
    if previous is not None and previous.removed:
        now = {i for run in seen.removed for i in _indices(run)}
        earlier = ", ".join(str(run["what"]) for run in previous.removed)
        back = [i for run in previous.removed for i in _indices(run) if i not in now]
        verdict = "is cut again" if not back else f"is partly put back ({len(back)} messages)"
        out.write(f"   what request {number - 1} cut ({earlier}) {verdict}\n")
    if seen.echo is not None:
        out.write(f"   echo upstream: {_arrived(seen.echo)}\n")
    if seen.step.stream and seen.usage is not None:
        u = seen.usage
        out.write(
            f"   streamed: usage chunk {u['prompt_tokens']:,} prompt + {u['completion_tokens']} completion tokens\n"
        )
    out.write(f"   log: {seen.log_line or '(none)'}\n")


def _indices(run: dict[str, Any]) -> range:
    """The message positions a folded run of the log covers ("message 7", "messages 1-4")."""
    where = str(run.get("what", "")).split(" ")[-1]
    first, _, last = where.partition("-")
    if not first.isdigit():
        return range(0)
    return range(int(first), int(last or first) + 1)


def _removed_lines(removed: Sequence[dict[str, Any]]) -> list[str]:
    """Removals as the log line folds them: one line per run of messages removed alike."""
    lines = []
    for run in removed:
        who = f"{run['count']} messages" if "count" in run else str(run.get("role") or "")
        kind = str(run.get("kind", "")).replace("_", " ")
        cut = "tokens" if run.get("kind") == "dropped" else "tokens cut"
        lines.append(f"{run['what']} ({who}) {kind}, {run.get('tokens', 0):,} {cut} ({run.get('strategy', '')})")
    return lines


def _arrived(echo: dict[str, Any]) -> str:
    calls = ", ".join(f"{c['name']} {'+ result' if c['answered'] else 'WITHOUT result'}" for c in echo["tool_calls"])
    validity = "valid" if echo["valid"] else f"INVALID ({'; '.join(echo['problems'])})"
    tools = f"; tool calls: {calls}" if calls else ""
    roles = ", ".join(f"{n} {role}" for role, n in Counter(echo["roles"]).items())
    counted = f"{echo['prompt_tokens']:,} prompt tokens by its own count"
    return f"{echo['messages']} messages ({roles}), {counted}, {validity}{tools}"


def _n(value: object) -> str:
    return f"{int(value):,}" if isinstance(value, str) and value.isdigit() else "?"


def _verdict(out: TextIO, seen: Sequence[Seen]) -> int:
    failures = [f"request {i}: {p}" for i, s in enumerate(seen, start=1) for p in s.problems()]
    if not any(s.removed for s in seen):
        failures.append("no request was cut: the agent conversation should not fit")
    if failures:
        out.write("\nThe demo did not go as expected:\n" + "".join(f"  {f}\n" for f in failures))
        return 1
    out.write(f"\nAll {len(seen)} requests answered; every one arrived within its budget and valid.\n")
    return 0


# The demo's conversations: an agent asked to find why CI fails, whose test run returns a long log.

SYSTEM = "You are a coding agent working in the context-guard repository. Use the tools; quote file paths exactly."
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": []},
        },
    }
    for name, description in (("run_tests", "Run pytest on a path."), ("read_file", "Read a file."))
]


def _call(call_id: str, name: str, path: str) -> dict[str, Any]:
    arguments = json.dumps({"path": path})
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def pytest_log(tests: int = 240) -> str:
    """A test run's output, long enough to overflow a small window: passing tests, then one failure."""
    lines = [
        "============================= test session starts ==============================",
        "collected 241 items",
        "",
    ]
    for i in range(tests):
        module = ("budget", "tokens", "trim", "turns", "models", "shrink")[i % 6]
        lines.append(
            f"tests/core/test_{module}.py::test_case_{i:03d} PASSED{' ' * 20}[{(i + 1) * 100 // (tests + 1):3d}%]"
        )
    lines += [
        "tests/core/test_budget.py::test_reserve_is_clamped FAILED                  [100%]",
        "",
        "=================================== FAILURES ===================================",
        "___________________________ test_reserve_is_clamped ____________________________",
        "    def test_reserve_is_clamped():",
        ">       assert output_reserve(window=4096) == 614",
        "E       assert 500 == 614",
        "proxy/core/budget.py:41: AssertionError",
        "=========================== 1 failed, 240 passed in 3.21s ============================",
    ]
    return "\n".join(lines)


def steps() -> list[Step]:
    client = "with the anthropic SDK" if sdk_installed() else "over plain HTTP (pip install anthropic for its SDK)"
    earlier: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "What does proxy/core/budget.py do?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("call_1", "read_file", "proxy/core/budget.py")]},
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": '"""The input budget: context window - output reserve - safety margin."""\n' * 12,
        },
        {
            "role": "assistant",
            "content": "It computes the input budget: the window minus an output reserve and a safety margin.",
        },
        {"role": "user", "content": "CI is red on main. Find out why."},
        {"role": "assistant", "content": None, "tool_calls": [_call("call_2", "run_tests", "tests/core")]},
        {"role": "tool", "tool_call_id": "call_2", "content": pytest_log()},
    ]
    one_turn_later: list[dict[str, Any]] = [
        *earlier,
        {
            "role": "assistant",
            "content": "test_reserve_is_clamped fails: output_reserve(4096) returns the 500 floor, not 15% (614).",
        },
        {"role": "user", "content": "Fix it, then rerun only that test."},
    ]
    return [
        Step(
            "A short chat that fits",
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hello! What can you do?"}],
        ),
        Step("An agent conversation whose test log cannot fit", earlier),
        Step("The same conversation, one turn later", one_turn_later),
        Step("The same, streamed", one_turn_later, stream=True),
        Step(f"The same as Anthropic Messages to {CLAUDE}, {client}", one_turn_later, anthropic=True),
        Step(f"The same as Gemini's generateContent to {GEMINI}, on its own path", one_turn_later, gemini=True),
        Step(f"The same as an interaction with {GEMINI} (Google's Interactions API)", one_turn_later, interaction=True),
    ]
