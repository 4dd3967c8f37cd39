"""Claude Code and Codex CLI, the real agent clients from the npm registry (pinned and installed by
scripts/install-agent-clis.sh, which `make test-compat` runs first), driven through the guard
against a scripted model: one prompt, shell calls each printing real files of the repository, then a
final answer. Each CLI runs offline in a subprocess: its only server is the guard on loopback
(any other address goes to a closed port through HTTP(S)_PROXY), in a throw-away home. The model
reports the input tokens of what reached it, as the provider would, so each CLI decides when to
compact on the numbers it would see from the real API.

The 30-call loop runs at windows far smaller than it needs whole (`LOOP_WINDOWS`: 64k for Claude
Code, 32k for Codex, where the 31 requests reach about 200k tokens): the guard clears old tool
results inside the turn (proxy.core.trimming.clearing), so it completes with no refusal it cannot
recover from and no compaction, and every forwarded body is within the budget by an independent
count (o200k_base directly, on the body as the model received it). At 16k, Codex with encrypted
reasoning completes 12 calls of ~8k tokens: the guard keeps fewer of the newest exchanges whole
rather than refuse. Below what its instructions need (`TOO_SMALL`: 8k) the guard refuses in the
API's words, and Codex stops short of the answer. Told of a window near the guard's, each CLI
compacts its history itself (`OWN_COMPACTION`): the guard fits the compaction request as one, and
the steps after it go on from the summary.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.compat.agent_answers import ENCRYPTED_SUMMARY, SUMMARY
from tests.compat.agent_model import FINAL_ANSWER, AgentModel, Served, guarded, independent_tokens
from tests.compat.conftest import Servers

STEPS = 30
CLAUDE_MODEL, CODEX_MODEL = "claude-sonnet-4-6", "gpt-5.5"
PROMPT = "Read the files one by one with the shell, then say that you are done."
# Claude Code: about 23,000 tokens of tools and system prompt, 32,000 of max_tokens; Codex: about
# 7,600 and no max_output_tokens. Each of the 30 results is 14-24 KB.
LOOP_WINDOWS = {"claude": 64_000, "codex": 32_000}
TOO_SMALL = {"codex": 8_000}
# Each CLI's own compaction: the guard's window, the scripted model, the setting that tells the CLI
# when to compact (see TestTheirOwnCompaction).
OWN_COMPACTION: dict[str, tuple[int, dict[str, Any], str]] = {
    # Claude Code prints fixed files (`pinned_files`), 16 KB each: it compacts after the guard's
    # first clearing, at 47.25% of 100,000 less 20,000.
    "claude": (
        90_000,
        {"steps": 8},
        "CLAUDE_CODE_AUTO_COMPACT_WINDOW=100000\nCLAUDE_AUTOCOMPACT_PCT_OVERRIDE=47.25\n",
    ),
    "codex": (32_000, {"steps": 6, "files_per_step": 2, "reasoning": True}, "model_context_window = 32000\n"),
    # Told of a larger window than the guard's (it truncates what it sends to its own window), and
    # to compact just above the guard's budget (26,304 tokens).
    "codex-as-openai": (
        32_000,
        {"steps": 3, "files_per_step": 2, "reasoning": True},  # one compaction (see TestAfterARemoteCompaction)
        "model_context_window = 40000\nmodel_auto_compact_token_limit = 28000\n",
    ),
}


def clis() -> Path:
    folder = os.environ.get("CONTEXT_GUARD_AGENT_CLIS")
    if not folder:
        pytest.skip("the agent CLIs are installed by `make test-compat` (scripts/install-agent-clis.sh)")
    return Path(folder)


def offline_env(home: Path) -> dict[str, str]:
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, so any outside call fails at once
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "HTTP_PROXY": closed,
        "HTTPS_PROXY": closed,
        "http_proxy": closed,
        "https_proxy": closed,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def run_claude(served: Served, home: Path, settings: str = "") -> subprocess.CompletedProcess[str]:
    """Claude Code in print mode; `settings`: environment variables, one `NAME=value` a line."""
    env = (
        offline_env(home)
        | dict(line.split("=", 1) for line in settings.splitlines() if line)
        | {
            "ANTHROPIC_BASE_URL": served.root,
            "ANTHROPIC_API_KEY": "sk-ant-offline",
            "ANTHROPIC_MODEL": CLAUDE_MODEL,
            "ANTHROPIC_SMALL_FAST_MODEL": CLAUDE_MODEL,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": CLAUDE_MODEL,
            "IS_SANDBOX": "1",  # as root, --dangerously-skip-permissions needs it
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
    )
    command = [str(clis() / "claude"), "-p", PROMPT, "--dangerously-skip-permissions", "--model", CLAUDE_MODEL]
    return subprocess.run(command, env=env, cwd=home, capture_output=True, text=True, timeout=900, check=False)


def run_codex(served: Served, home: Path, settings: str = "") -> subprocess.CompletedProcess[str]:
    """Codex CLI's `exec` with the guard as a provider of its own (`model_providers`); `settings`:
    more lines of its config.toml's top level."""
    provider = (
        'model_provider = "guard"\n'
        f"{settings}"
        "[model_providers.guard]\n"
        'name = "guard"\n'
        f'base_url = "{served.root}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "GUARD_API_KEY"\n'
    )
    return _codex(home, provider, {"GUARD_API_KEY": "sk-offline"})


def run_codex_as_openai(served: Served, home: Path, settings: str = "") -> subprocess.CompletedProcess[str]:
    """Codex CLI's `exec` with its built-in OpenAI provider sent to the guard (`openai_base_url`),
    the provider it compacts remotely with; it tries a WebSocket first, which the guard refuses
    (405), and goes on over HTTP."""
    return _codex(home, f'openai_base_url = "{served.root}/v1"\n{settings}', {"CODEX_API_KEY": "sk-offline"})


def _codex(home: Path, config: str, keys: dict[str, str]) -> subprocess.CompletedProcess[str]:
    codex_home = home / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        f'model = "{CODEX_MODEL}"\n'
        'approval_policy = "never"\n'
        'sandbox_mode = "danger-full-access"\n'
        "check_for_update_on_startup = false\n"
        f"{config}",
        encoding="utf-8",
    )
    env = offline_env(home) | {"CODEX_HOME": str(codex_home)} | keys
    command = [str(clis() / "codex"), "exec", "--skip-git-repo-check", PROMPT]
    return subprocess.run(command, env=env, cwd=home, capture_output=True, text=True, timeout=900, check=False)


RUNS = {
    "claude": (run_claude, CLAUDE_MODEL),
    "codex": (run_codex, CODEX_MODEL),
    "codex-as-openai": (run_codex_as_openai, CODEX_MODEL),
}


def drive(
    servers: Servers, cli: str, window: int, model: AgentModel | None = None, settings: str = ""
) -> tuple[subprocess.CompletedProcess[str], Served, AgentModel]:
    run, model_name = RUNS[cli]
    model = model or AgentModel(steps=STEPS)
    with guarded(model, window, (model_name,), servers.logs) as served, tempfile.TemporaryDirectory() as home:
        done = run(served, Path(home), settings)
        if os.environ.get("CONTEXT_GUARD_DUMP"):  # what reached the model, for reading
            received = [{"path": r.path, "body": r.body} for r in model.received]
            Path(os.environ["CONTEXT_GUARD_DUMP"]).write_text(json.dumps(received, indent=1), encoding="utf-8")
        return done, served, model


def input_budget(window: int, body: dict[str, Any]) -> int:
    """docs/trimming.md's budget, written out here: the window less the output the request asks for
    (else 15% of the window, 500 to 4,096) and the 5% safety margin."""
    asked = body.get("max_tokens") or body.get("max_output_tokens")
    reserve = asked if isinstance(asked, int) else max(500, min(4096, int(window * 0.15)))
    return window - reserve - math.ceil(window * 0.05)


@pytest.mark.parametrize("cli", ["claude", "codex"])
class TestAgentLoop:
    def test_the_30_call_loop_completes_with_every_body_within_the_budget(self, cli: str, servers: Servers) -> None:
        window = LOOP_WINDOWS[cli]
        done, served, model = drive(servers, cli, window)
        assert done.returncode == 0, done.stderr[-2000:]
        assert FINAL_ANSWER in done.stdout and model.calls == STEPS and not model.compactions
        assert len(model.loop_bodies) == STEPS + 1
        for body in model.loop_bodies:
            assert independent_tokens(body) <= input_budget(window, body)
        for body, paths in zip(model.loop_bodies[1:], model.files, strict=True):  # each output reached the model
            assert json.dumps(paths[0].read_text(encoding="utf-8")[:200])[1:-1] in json.dumps(body), paths[0]
        # A refusal the client recovers from (Claude Code's max_tokens, lowered on Anthropic's sentence)
        # is answered by its retry; none ends the loop.
        events = served.log_events()
        assert events[-1]["status"] == 200
        assert all(b["status"] == 200 for a, b in itertools.pairwise(events) if a["status"] != 200)


class TestCodexWithEncryptedReasoningAtASmallWindow:
    def test_twelve_calls_of_8k_tokens_complete_at_16k_with_every_body_within_the_budget(
        self, servers: Servers
    ) -> None:
        """Codex's ~7.6k tokens of instructions and tools, its encrypted reasoning re-sent with every
        call (`store: false`), and results of ~8k tokens each: the guard keeps fewer of the newest
        exchanges whole, the newest one shortened as the last resort, rather than refuse."""
        model = AgentModel(steps=12, files_per_step=2, reasoning=True)
        done, served, _ = drive(servers, "codex", 16_000, model)
        assert done.returncode == 0, done.stderr[-2000:]
        assert FINAL_ANSWER in done.stdout and model.calls == 12 and not model.compactions
        assert len(model.loop_bodies) == 13
        for body in model.loop_bodies:
            assert independent_tokens(body) <= input_budget(16_000, body)
        for body in model.loop_bodies[1:]:  # Codex sent its reasoning back, and the guard forwarded it
            assert any(i.get("type") == "reasoning" and i.get("encrypted_content") for i in body["input"])
        for body, paths in zip(model.loop_bodies[1:], model.files, strict=True):  # each output reached the model
            assert json.dumps(paths[0].read_text(encoding="utf-8")[:200])[1:-1] in json.dumps(body), paths[0]
        assert all(e["status"] == 200 for e in served.log_events())


class TestBelowWhatItsInstructionsNeed:
    """What may not be cut (instructions, tools, the latest prompt) over the budget: refused in the
    API's words, and the CLI stops short of the answer."""

    def test_codex_is_refused_and_stops_short_of_the_answer(self, servers: Servers) -> None:
        done, served, model = drive(servers, "codex", TOO_SMALL["codex"])
        refused = [e for e in served.log_events() if e.get("outcome") == "rejected"]
        assert refused and refused[-1]["status"] == 400
        assert done.returncode != 0 and model.calls == 0 and FINAL_ANSWER not in done.stdout


class TestClaudeCodeAtTheWindowsEdge:
    def test_it_lowers_max_tokens_on_anthropics_sentence_and_the_loop_goes_on(self, servers: Servers) -> None:
        """Its 32,000 `max_tokens` does not fit a 64k window beside its 23k-token prompt: refused in
        Anthropic's words, it reads the numbers, lowers `max_tokens` and sends again at once."""
        _, served, model = drive(servers, "claude", LOOP_WINDOWS["claude"])
        first, second = served.log_events()[:2]
        assert (first["outcome"], first["status"], second["status"]) == ("rejected", 400, 200)
        assert model.received[0].body["max_tokens"] < 32_000 and model.calls > 1


class TestTheirOwnCompaction:
    """Each CLI compacts its history itself once the usage the model reports nears the window it
    is told of (Codex: `model_context_window`, from which it derives its auto-compact limit; Claude
    Code: `CLAUDE_CODE_AUTO_COMPACT_WINDOW`, at least 100,000, scaled down by
    `CLAUDE_AUTOCOMPACT_PCT_OVERRIDE`). Its compaction request is the whole history and a summary
    prompt, over the guard's window: the guard counts it as a compaction request and fits it by
    shortening every tool result evenly, never clearing one nor forwarding it over; the summary is
    answered, and the steps after it start from the summary and complete the loop."""

    @pytest.mark.parametrize("cli", ["claude", "codex", "codex-as-openai"])
    def test_the_compaction_request_is_fitted_whole_and_the_loop_goes_on_from_the_summary(
        self, cli: str, servers: Servers, tmp_path: Path
    ) -> None:
        window, shape, settings = OWN_COMPACTION[cli]
        model = AgentModel(**shape, folder=pinned_files(tmp_path) if cli == "claude" else None)
        done, served, _ = drive(servers, cli, window, model, settings)
        assert done.returncode == 0, done.stderr[-2000:]
        assert FINAL_ANSWER in done.stdout and model.calls == model.steps
        assert model.compactions, "the CLI did not compact"
        forwarded = [e for e in served.log_events() if "upstream_status" in e]
        assert len(forwarded) == len(model.received)
        over = 0
        for compaction in model.compactions:
            k = next(k for k, r in enumerate(model.received) if r.body is compaction)
            event, text = forwarded[k], json.dumps(compaction)
            assert independent_tokens(compaction) <= input_budget(window, compaction)
            assert event["tokens_after"] <= event["budget"]
            assert PROMPT in text or summarised(opening(compaction))  # the task, or the summary before
            assert "context-guard cleared" not in text  # no result emptied: every exchange has material
            if event["outcome"] == "trimmed":  # fitted as a compaction request: every result shortened evenly
                over += 1
                assert event["tokens_before"] > event["budget"]
                kinds = {(r["kind"], r["strategy"]) for r in event["removed"]}
                assert kinds == {("truncated", "clear_tool_results")}, event["removed"]
            after = model.received[k + 1].body  # the next step starts from the summary
            assert summarised(opening(after)), opening(after)
        assert over, "no compaction request was over the window"
        for body in model.loop_bodies:
            assert independent_tokens(body) <= input_budget(window, body)


def pinned_files(folder: Path, size: int = 16_000) -> Path:
    """Files of fixed content to print: Claude Code's own `sdk-tools.d.ts` (pinned with it) cut on
    line ends into pieces of about `size` bytes. Claude Code compacts on the usage reported for
    what the guard forwarded, which peaks a little higher once the guard clears results than just
    before: the point where it compacts (after the clearing began, so that its compaction request,
    its whole history, is over the window) must not move with the repository's files."""
    text = (clis().parent / "@anthropic-ai" / "claude-code" / "sdk-tools.d.ts").read_text(encoding="utf-8")
    pieces, start = [], 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end < 0 else end + 1
        pieces.append(text[start:end])
        start = end
    for k, piece in enumerate(pieces):
        (folder / f"sdk-tools-{k:02d}.ts").write_text(piece, encoding="utf-8")
    return folder


def summarised(items: list[Any]) -> bool:
    """Whether `items` hold the summary: as text (Claude Code, Codex's own compaction) or as the
    compaction item the provider answered (Codex's remote compaction)."""
    return SUMMARY in json.dumps(items) or any(i.get("encrypted_content") == ENCRYPTED_SUMMARY for i in items)


def opening(body: dict[str, Any]) -> list[Any]:
    """A request's history up to its first tool result: where a compacted history holds its summary."""
    items = body.get("messages") or body.get("input") or []
    results = (
        k
        for k, item in enumerate(items)
        if "tool_result" in json.dumps(item) or item.get("type") == "function_call_output"
    )
    return items[: next(results, len(items))]


class TestAfterARemoteCompaction:
    def test_the_request_after_codexs_compaction_item_is_counted_with_what_precedes_the_item(
        self, servers: Servers
    ) -> None:
        """Codex's next request after a remote compaction is its instructions, the user's messages,
        then the compaction item: the guard's count of it is at least the independent count of
        what it holds, or a later request of the same history may go out over the window."""
        window, shape, settings = OWN_COMPACTION["codex-as-openai"]
        model = AgentModel(**shape)
        _, served, _ = drive(servers, "codex-as-openai", window, model, settings)
        forwarded = [e for e in served.log_events() if "upstream_status" in e]
        after = [k for k, r in enumerate(model.received) if any(i.get("type") == "compaction" for i in r.body["input"])]
        assert after, "Codex did not send a compaction item back"
        for k in after:
            assert forwarded[k]["tokens_before"] >= independent_tokens(model.received[k].body)
