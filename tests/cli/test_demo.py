"""`context-guard demo` and `context-guard serve --upstream echo`, run as a user runs them: in a
subprocess, with no API key in the environment."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI

from proxy.demo.tour import Seen, Step, _verdict

ROOT = Path(__file__).parents[2]


def clean_env(marker: str) -> dict[str, str]:
    """The test's environment without any OpenAI key or URL, tagged so its processes can be found."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    return {**env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "CONTEXT_GUARD_TEST_RUN": marker}


def processes_tagged(marker: str) -> list[int]:
    """Live processes whose environment carries `marker`."""
    tagged = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"CONTEXT_GUARD_TEST_RUN={marker}".encode() in (entry / "environ").read_bytes():
                    tagged.append(int(entry.name))
            except OSError:  # gone already, or not ours to read
                continue
    return tagged


def refuses_connections(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


@dataclass
class Request:
    number: int
    title: str
    lines: list[str]

    @property
    def log(self) -> dict[str, Any]:
        line = next(line for line in self.lines if line.strip().startswith("log: "))
        return dict(json.loads(line.strip()[5:]))

    @property
    def echo_line(self) -> str:
        return next(line for line in self.lines if line.strip().startswith("echo upstream: "))

    @property
    def echo_prompt_tokens(self) -> int:
        match = re.search(r"([\d,]+) prompt tokens by its own count", self.echo_line)
        assert match, self.echo_line
        return int(match.group(1).replace(",", ""))


@dataclass
class DemoRun:
    code: int
    out: str
    err: str
    marker: str

    @property
    def requests(self) -> list[Request]:
        requests: list[Request] = []
        for line in self.out.splitlines():
            heading = re.match(r"^(\d+)\. (.+)$", line)
            if heading:
                requests.append(Request(int(heading.group(1)), heading.group(2), []))
            elif requests:
                requests[-1].lines.append(line)
        return requests

    @property
    def ports(self) -> list[int]:
        return [int(p) for p in re.findall(r"http://127\.0\.0\.1:(\d+)/v1", self.out.splitlines()[0])]


@pytest.fixture(scope="module")
def demo() -> DemoRun:
    marker = uuid.uuid4().hex
    process = subprocess.run(
        [sys.executable, "-m", "proxy", "demo"],
        env=clean_env(marker),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    return DemoRun(process.returncode, process.stdout, process.stderr, marker)


@pytest.fixture(scope="module")
def demo_without_anthropic() -> DemoRun:
    """The demo where the anthropic SDK cannot be imported, as on the README's install (it is not a
    runtime dependency)."""
    marker = uuid.uuid4().hex
    hide = "import sys; sys.modules['anthropic'] = None; from proxy.cli import main; sys.exit(main(['demo']))"
    process = subprocess.run(
        [sys.executable, "-c", hide], env=clean_env(marker), capture_output=True, text=True, timeout=180, check=False
    )
    return DemoRun(process.returncode, process.stdout, process.stderr, marker)


class TestDemo:
    def test_it_exits_0_with_nothing_on_standard_error(self, demo):
        assert demo.code == 0, demo.out + demo.err
        assert demo.err == ""

    def test_it_sends_seven_requests_and_every_one_was_answered_by_the_echo_upstream(self, demo):
        assert [r.number for r in demo.requests] == [1, 2, 3, 4, 5, 6, 7]
        for request in demo.requests:
            assert request.log["status"] == 200 and request.log["upstream_status"] == 200, request.title
            assert "NOT ANSWERED" not in "\n".join(request.lines)
            assert request.echo_line

    def test_the_short_chat_is_forwarded_unchanged(self, demo):
        short = demo.requests[0]
        assert short.log["outcome"] == "unchanged" and short.log["removed_count"] == 0 and "removed" not in short.log
        assert short.echo_prompt_tokens == short.log["tokens_before"]

    def test_the_long_conversation_was_cut_to_fit_and_arrived_valid(self, demo):
        long = demo.requests[1]
        log = long.log
        assert log["outcome"] == "trimmed" and log["context_window"] == 4096
        assert log["tokens_after"] <= log["budget"] < log["tokens_before"]
        assert long.echo_prompt_tokens <= log["budget"]
        assert ", valid; tool calls: " in long.echo_line and "WITHOUT result" not in long.echo_line

    def test_every_removal_names_its_strategy_in_the_table_and_the_log(self, demo):
        for request in demo.requests[1:]:
            for removal in request.log["removed"]:
                assert f"({removal['strategy']})" in "\n".join(request.lines)

    def test_the_conversation_one_turn_later_and_its_stream_also_fit_and_arrive_valid(self, demo):
        for request in demo.requests[2:]:
            assert request.echo_prompt_tokens <= request.log["budget"]
            assert ", valid" in request.echo_line

    def test_the_streamed_request_got_its_usage_chunk(self, demo):
        streamed = demo.requests[3]
        usage = next(line for line in streamed.lines if "usage chunk" in line)
        assert f"{streamed.echo_prompt_tokens:,} prompt" in usage

    def test_the_anthropic_sdk_s_messages_request_is_cut_to_fit_and_arrives_valid(self, demo):
        messages = demo.requests[4]
        assert messages.log["kind"] == "messages" and messages.log["outcome"] == "trimmed"
        assert messages.echo_prompt_tokens <= messages.log["budget"] and ", valid; tool calls: " in messages.echo_line

    def test_the_interaction_is_cut_to_fit_and_arrives_valid(self, demo):
        interaction = demo.requests[6]
        assert interaction.log["kind"] == "interactions" and interaction.log["outcome"] == "trimmed"
        assert interaction.log["path"] == "/v1beta/interactions"
        assert interaction.echo_prompt_tokens <= interaction.log["budget"] and ", valid; tool calls: " in interaction.echo_line

    def test_the_gemini_request_on_its_own_path_is_cut_to_fit_and_arrives_valid(self, demo):
        gemini = demo.requests[5]
        assert gemini.log["kind"] == "generate_content" and gemini.log["outcome"] == "trimmed"
        assert gemini.log["path"] == "/v1beta/models/gemini-2.5-flash:generateContent"
        assert gemini.echo_prompt_tokens <= gemini.log["budget"] and ", valid; tool calls: " in gemini.echo_line

    def test_the_messages_request_names_the_sdk_that_sent_it(self, demo):
        assert demo.requests[4].title.endswith("with the anthropic SDK")

    def test_without_the_anthropic_sdk_the_messages_request_goes_over_plain_http_and_is_cut_the_same(
        self, demo, demo_without_anthropic
    ):
        plain = demo_without_anthropic
        assert plain.code == 0 and plain.err == "", plain.out + plain.err
        messages, with_sdk = plain.requests[4], demo.requests[4]
        assert "over plain HTTP (pip install anthropic for its SDK)" in messages.title
        assert messages.log["kind"] == "messages" and messages.log["outcome"] == "trimmed"
        assert messages.echo_prompt_tokens == with_sdk.echo_prompt_tokens <= messages.log["budget"]
        assert ", valid; tool calls: " in messages.echo_line

    def test_the_log_lines_carry_no_message_content(self, demo):
        for request in demo.requests:
            line = json.dumps(request.log)
            assert "CI is red" not in line and "coding agent" not in line and "PASSED" not in line

    def test_it_leaves_no_process_and_no_listening_port_behind(self, demo):
        assert len(demo.ports) == 2
        assert all(refuses_connections(port) for port in demo.ports)
        assert processes_tagged(demo.marker) == []


class TestServeWithEchoUpstream:
    def test_it_serves_the_echo_behind_the_guard_and_stops_both_on_interrupt(self):
        marker = uuid.uuid4().hex
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", "--upstream", "echo", "--port", "0"],
            env=clean_env(marker),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        read: list[str] = []
        try:
            assert process.stderr is not None
            # Port 0: the process binds a port of its own choosing and says which in its `listening` line.
            while (line := process.stderr.readline()) and '"listening"' not in line:
                read.append(line)
            assert line, "".join(read)
            read.append(line)
            port = json.loads(line)["port"]
            client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=30)
            raw = client.chat.completions.with_raw_response.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hello"}]
            )
            completion = raw.parse()
            models = [m.id for m in client.models.list()]
        finally:
            process.send_signal(signal.SIGINT)
            _, rest = process.communicate(timeout=30)
        err = "".join(read) + rest
        assert process.returncode == 0, err
        assert raw.headers["x-context-guard-tokens-after"] == str(completion.usage.prompt_tokens)
        assert completion.model_extra["echo"]["messages"] == 1 and models == ["echo"]
        listening = next(json.loads(line) for line in err.splitlines() if '"listening"' in line)
        echo_port = int(listening["upstreams"]["echo"].rsplit(":", 1)[1].split("/")[0])
        assert refuses_connections(port) and refuses_connections(echo_port)
        assert processes_tagged(marker) == []


def seen(echo: dict[str, Any] | None, status: int = 200, removed: list[dict[str, Any]] | None = None) -> Seen:
    log = {"removed": removed if removed is not None else [{"index": 1, "strategy": "drop_oldest_turns"}]}
    headers = {"x-context-guard-budget": "100"}
    return Seen(Step("a request", []), "demo-1", status, headers, "", echo, None, "{}", log)


ARRIVED: dict[str, Any] = {"prompt_tokens": 90, "valid": True, "problems": []}


class TestVerdict:
    def test_requests_that_arrived_within_budget_and_valid_exit_0(self):
        out = io.StringIO()
        assert _verdict(out, [seen(ARRIVED)]) == 0 and "All 1 requests answered" in out.getvalue()

    def test_a_conversation_that_arrived_invalid_exits_1_naming_the_request_and_the_problem(self):
        out = io.StringIO()
        echo = {**ARRIVED, "valid": False, "problems": ["messages[2]: tool result 'c1' has no preceding call"]}
        assert _verdict(out, [seen(echo)]) == 1
        assert "request 1: arrived invalid: messages[2]: tool result 'c1' has no preceding call" in out.getvalue()

    def test_a_conversation_that_arrived_over_budget_exits_1(self):
        out = io.StringIO()
        assert _verdict(out, [seen({**ARRIVED, "prompt_tokens": 101})]) == 1
        assert "101 tokens arrived upstream; the budget is 100" in out.getvalue()

    def test_an_unanswered_request_exits_1(self):
        out = io.StringIO()
        assert _verdict(out, [seen(None, status=502)]) == 1 and "not answered" in out.getvalue()

    def test_a_run_in_which_nothing_was_cut_exits_1(self):
        out = io.StringIO()
        assert _verdict(out, [seen(ARRIVED, removed=[])]) == 1 and "no request was cut" in out.getvalue()
