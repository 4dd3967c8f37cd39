"""The operator's checklist for trim logs, run against a real proxy and a real fake upstream.

- The console line of a trimmed request is the one docs/operations.md's "Reading a trim log line" shows
  (summary first, removals as an aligned, indented block), and so is the JSON line.
- A request with hundreds of removals still logs one line under `log.max_line_bytes`.
- Every `jq` one-liner in that section runs, with `jq`, on real log output and prints what
  its comment says.
"""

from __future__ import annotations

import io
import json
import re
import select
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.config.settings import settings_from_dict
from proxy.logging import configure_logging
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.server.conftest import long_conversation
from tests.support.upstream import FakeUpstream

OPERATIONS = Path(__file__).parents[3] / "docs" / "operations.md"
SECTION = "## Reading a trim log line"
LOG_FILE = "context-guard.log"  # the file name the documented one-liners read


def documented_section() -> str:
    text = OPERATIONS.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end != -1 else len(text)]


def fenced_blocks(section: str, language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


def normalised(text: str) -> str:
    """The parts that change from run to run (time, milliseconds) replaced by placeholders."""
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "<time>", text)
    return re.sub(r'((?:count|trim|upstream|total)_ms"?[=:] ?)[\d.]+', r'\1"<ms>"', text)


def an_agent_conversation() -> list[dict[str, Any]]:
    """A long chat whose latest turn ends in a large tool result: history is dropped, then the
    result is truncated."""
    history = long_conversation(60)[:-1]
    call = {"id": "call_1", "type": "function", "function": {"name": "read_log", "arguments": '{"lines": 5000}'}}
    return [
        *history,
        {"role": "user", "content": "What does the deploy log say?"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "deploy step ok " * 4000},
    ]


def many_tool_results(count: int) -> list[dict[str, Any]]:
    """`count` tool exchanges in one turn, so each truncated result is a separate removal run."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Check every shard."}]
    for i in range(count):
        call = {"id": f"call_{i}", "type": "function", "function": {"name": "shard", "arguments": f'{{"n": {i}}}'}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"shard {i} healthy " * 300})
    return messages


class Proxy:
    """A real proxy (upstream named `openai`, pointing at a fake one) whose log goes to `stream`."""

    def __init__(self, server: Any, stream: io.StringIO) -> None:
        self.server, self.stream = server, stream

    async def chat(self, model: str, messages: list[dict[str, Any]], request_id: str) -> int:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                self.server.make_url("/v1/chat/completions"),
                json={"model": model, "messages": messages},
                headers={"x-request-id": request_id},
            ) as response:
                await response.read()
                return response.status

    def request_lines(self) -> list[str]:
        return [line for line in self.stream.getvalue().splitlines() if '"event":"request"' in line]


@pytest.fixture
def start(aiohttp_server: Any, model_map: Any) -> Any:
    async def start(log_format: str = "json", **sections: Any) -> Proxy:
        fake = FakeUpstream()
        upstream = await aiohttp_server(fake.app())
        data = {"upstreams": {"openai": {"base_url": str(upstream.make_url("/v1"))}}, **sections}
        settings = settings_from_dict(data, "context-guard.yaml", {})
        stream = io.StringIO()
        configure_logging(log_format, "info", stream=stream)
        server = await aiohttp_server(create_app(settings, Models(settings, model_map)))
        return Proxy(server, stream)

    return start


class TestTheDocumentedLine:
    async def test_the_console_line_of_a_trimmed_request_is_the_one_the_docs_show(self, start):
        proxy = await start("console")
        assert await proxy.chat("gpt-4", an_agent_conversation(), "req-7f3a") == 200
        live = normalised(proxy.stream.getvalue().rstrip("\n"))
        documented = [block for block in fenced_blocks(documented_section(), "text") if "request_id=" in block]
        assert documented, "the section shows a console line"
        assert normalised(documented[0].rstrip("\n")) == live, f"docs/operations.md should show:\n{live}"

    async def test_the_console_form_is_a_summary_line_then_an_aligned_indented_block(self, start):
        proxy = await start("console")
        await proxy.chat("gpt-4", an_agent_conversation(), "req-7f3a")
        head, *block = proxy.stream.getvalue().rstrip("\n").splitlines()
        summary = [field.split("=")[0] for field in head.split()[3:9]]
        assert summary == ["request_id", "outcome", "status", "model", "tokens_before", "tokens_after"]
        assert len(block) == 2 and all(line.startswith("    ") and not line[4].isspace() for line in block)
        columns = [[m.start() for m in re.finditer(r"(?<=  )\S", line[4:])] for line in block]
        assert columns[0] == columns[1]  # range, what, tokens and strategy start at the same offsets
        assert block[0].split()[-1] == "drop_oldest_turns" and block[1].split()[-1] == "shrink_tool_results"

    async def test_the_json_line_is_the_one_the_docs_show(self, start):
        proxy = await start("json")
        await proxy.chat("gpt-4", an_agent_conversation(), "req-7f3a")
        (line,) = proxy.request_lines()
        documented = [block for block in fenced_blocks(documented_section(), "json") if '"request_id"' in block]
        assert documented, "the section shows a JSON line"
        shown, written = json.loads(normalised(documented[0])), json.loads(normalised(line))
        assert list(shown.items()) == list(written.items()), f"docs/operations.md should show:\n{line}"  # order too


class TestLineSize:
    @pytest.mark.parametrize("max_line_bytes", [1024, 8192])
    async def test_hundreds_of_removals_stay_under_the_configured_bound(self, start, max_line_bytes):
        proxy = await start(
            log={"max_line_bytes": max_line_bytes},
            trim={"pipeline": ["shrink_tool_results"], "options": {"shrink_tool_results": {"cap": 40}}},
        )
        assert await proxy.chat("gpt-4o", many_tool_results(300), "req-many") == 200
        (line,) = proxy.request_lines()
        event = json.loads(line)
        assert event["removed_count"] == event["by_strategy"]["shrink_tool_results"]["count"] > 200
        assert len(line.encode()) <= max_line_bytes
        assert re.fullmatch(r"\d+ more runs", event["removed"][-1]["what"])

    async def test_by_default_a_line_is_one_atomic_write_to_a_pipe(self, start):
        """Workers share the supervisor's stdout: a write of at most PIPE_BUF bytes to a pipe is
        never interleaved with another process's, so no line of one worker splits another's."""
        proxy = await start(trim={"pipeline": ["shrink_tool_results"], "options": {"shrink_tool_results": {"cap": 40}}})
        assert await proxy.chat("gpt-4o", many_tool_results(300), "req-many") == 200
        (line,) = proxy.request_lines()
        assert json.loads(line)["removed_count"] > 200
        assert len(line.encode()) + len(b"\n") <= select.PIPE_BUF

    async def test_previews_opted_into_do_not_break_the_bound(self, start):
        proxy = await start(
            log={"content_preview_chars": 200},
            trim={"pipeline": ["shrink_tool_results"], "options": {"shrink_tool_results": {"cap": 40}}},
        )
        await proxy.chat("gpt-4o", many_tool_results(300), "req-many")
        (line,) = proxy.request_lines()
        assert len(line.encode()) <= 8192 and json.loads(line)["removed_count"] > 200


def jq_one_liners() -> list[tuple[str, str]]:
    """(comment, command) for every `jq` line in the section's shell blocks."""
    found = []
    for block in fenced_blocks(documented_section(), "sh"):
        comment = ""
        for line in block.splitlines():
            if line.startswith("#"):
                comment = line.lstrip("# ")
            elif line.startswith("jq "):
                found.append((comment, line))
    return found


class TestTheDocumentedJqOneLiners:
    @pytest.fixture
    async def log_file(self, start, tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
        if shutil.which("jq") is None:
            pytest.skip("jq is not installed (scripts/install-components.sh installs it)")
        proxy = await start("json")
        huge_system = [{"role": "system", "content": "rule " * 20_000}, {"role": "user", "content": "hi"}]
        assert await proxy.chat("gpt-4", an_agent_conversation(), "req-7f3a") == 200
        assert await proxy.chat("gpt-4o", [{"role": "user", "content": "hi"}], "req-2b10") == 200
        assert await proxy.chat("gpt-4", huge_system, "req-9c41") == 400
        assert await proxy.chat("gpt-4", long_conversation(), "req-c0de") == 200
        path = tmp_path / LOG_FILE
        path.write_text(proxy.stream.getvalue())
        return path, [json.loads(line) for line in proxy.request_lines()]

    def run(self, command: str, log: Path) -> str:
        done = subprocess.run(
            ["bash", "-c", command], cwd=log.parent, capture_output=True, text=True, timeout=30, check=False
        )
        assert done.returncode == 0, f"{command}\n{done.stderr}"
        return done.stdout

    def test_the_section_has_the_one_liners_these_tests_check(self):
        assert [comment for comment, _ in jq_one_liners()] == list(EXPECTED)

    async def test_each_one_liner_prints_what_its_comment_says(self, log_file):
        log, events = log_file
        for comment, command in jq_one_liners():
            assert EXPECTED[comment](self.run(command, log), events), f"{comment}: {command}"


def _trimmed(out: str, events: list[dict[str, Any]]) -> bool:
    keys = ("request_id", "model", "tokens_before", "tokens_after", "removed_tokens")
    wanted = [{k: e[k] for k in keys} for e in events if e["outcome"] == "trimmed"]
    return [json.loads(line) for line in out.splitlines()] == wanted and len(wanted) == 2


def _outcomes(out: str, events: list[dict[str, Any]]) -> bool:
    counted = {line.split()[1]: int(line.split()[0]) for line in out.splitlines()}
    return counted == {"trimmed": 2, "unchanged": 1, "rejected": 1}


def _warnings(out: str, events: list[dict[str, Any]]) -> bool:
    return [json.loads(line)["request_id"] for line in out.splitlines()] == ["req-9c41"]


def _by_strategy(out: str, events: list[dict[str, Any]]) -> bool:
    totals: dict[str, dict[str, int]] = {}
    for event in events:
        for name, entry in event.get("by_strategy", {}).items():
            total = totals.setdefault(name, {"requests": 0, "removed": 0, "tokens": 0})
            total["requests"] += 1
            total["removed"] += entry["count"]
            total["tokens"] += entry["tokens"]
    return {row.pop("strategy"): row for row in json.loads(out)} == totals and "shrink_tool_results" in totals


def _one_request(out: str, events: list[dict[str, Any]]) -> bool:
    (shown,) = json_values(out)  # pretty-printed: one value over many lines
    return shown == next(e for e in events if e["request_id"] == "req-7f3a")


def json_values(text: str) -> list[Any]:
    decoder, values, at = json.JSONDecoder(), [], 0
    while text[at:].strip():
        value, at = decoder.raw_decode(text, at + len(text[at:]) - len(text[at:].lstrip()))
        values.append(value)
    return values


def _runs(out: str, events: list[dict[str, Any]]) -> bool:
    rows = [line.split("\t") for line in out.splitlines()]
    wanted = [
        [e["request_id"], r["what"], r["kind"], str(r["tokens"]), r["strategy"]]
        for e in events
        for r in e.get("removed", [])
    ]
    return rows == wanted and len(rows) == 3


EXPECTED = {
    "every trimmed request: id, model, tokens before and after, tokens removed": _trimmed,
    "how many requests ended each way": _outcomes,
    "what needs a look: rejections, fallback windows, over-budget forwards": _warnings,
    "tokens removed per strategy, over the whole log": _by_strategy,
    "one request, by the id the client sent (x-request-id) or got back": _one_request,
    "every removal run as a table: request, messages, what happened, tokens, strategy": _runs,
}
