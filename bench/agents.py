"""Agent sessions through the core, priced with prompt caching against the untrimmed conversation.

A coding agent re-sends its whole conversation after every tool result, and its tool output is
most of it. Each seeded session below is made of real content: the tool results are slices of
the Python standard library's own files (`read_file`) and real matches of an identifier across
them (`grep`), read when the bench runs; the user gives a few tasks, the assistant says a line
before each call and answers each task with a real docstring. Sessions run 44 to 118 tool steps.
Every request of a session (after each user message and each tool result) goes through the core
(`plan_request`, the gpt-4o profile and tokenizer, the window set to 32k or 128k, `max_tokens`
4,096), once per trimmer, and what each forwards is priced:

- **OpenAI-like**: input at 1, the prefix shared with the same trimmer's previous request at 0.1
  (GPT-5's published cached-input price, $0.125 against $1.25 per million; gpt-4o's is 0.5), once
  it is 1,024 tokens or more, in steps of 128 (OpenAI's caching rule).
- **Anthropic-like**: the shared prefix read at 0.1, the rest written to the cache at 1.25 (the
  5-minute cache write; a breakpoint at the end of every request, as Claude Code sets one), with
  the same 1,024-token minimum.

The shared prefix is the tool definitions and the whole messages, from the first, that are the
same in both requests, in the guard's own per-message counts. Output tokens are left out (the
same for every trimmer). The cost is the sum over all requests of all sessions, over the cost of
the untrimmed conversation priced the same way as if the window held it ("untrimmed-if-it-fit").

Also per trimmer: refused requests; the share of user messages and of assistant messages that
reach the model verbatim (over all requests); the share of the newest 10 tool results that do;
the window used (tokens sent over the window, mean over the requests the trimmer changed); and
the prefix reuse (the shared prefix over the tokens sent, same requests).

Trimmers: the guard's default pipeline (`clear_tool_results` first: old results cleared, once a
request is over, until it is 0.45 of its input budget under it, the newest 3 kept), the same
keeping the newest 10, the same clearing in smaller and larger blocks (0.2 and 0.6), the pipeline before
`clear_tool_results` (whole turns dropped, results shortened), and naive observation masking
(every result but the newest 10 replaced by the placeholder on every request, then the default
pipeline).

Run: python bench/agents.py [--sessions N] [--print]   (writes its section of docs/benchmarks.md)
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.publish import write_section  # noqa: E402
from proxy.core.counting.count_cache import CountCache  # noqa: E402
from proxy.core.counting.request_count import RequestCounter  # noqa: E402
from proxy.core.counting.tokenizer import Tokenizer  # noqa: E402
from proxy.core.models.model_registry import ModelProfile, ModelRegistry  # noqa: E402
from proxy.core.plan import TrimPolicy, plan_request  # noqa: E402
from proxy.core.trimming.budget import BudgetPolicy  # noqa: E402
from proxy.core.trimming.clearing import placeholder  # noqa: E402
from proxy.core.trimming.strategies import DEFAULT_PIPELINE, build_pipeline  # noqa: E402
from proxy.tokenizers.model_map import load_model_map  # noqa: E402
from proxy.tokenizers.vocabularies import Tokenizers  # noqa: E402
from tests.support.agent_sessions import CHAT_TOOL, _sources, file_slices  # noqa: E402

START, END = "<!-- agents:start (bench/agents.py) -->", "<!-- agents:end -->"
STEPS = (44, 58, 66, 75, 84, 95, 106, 118)
WINDOWS = (32_768, 131_072)
MAX_TOKENS = 4096
LAST = 10  # the newest tool results whose keeping is measured
SYSTEM = (
    "You are a coding agent working in the user's repository. Use the tools to read files and search "
    "the code; say in one line what you are about to do before each call; answer each task with what "
    "you found, citing files and lines. Do not guess at code you have not read."
)
# What an agent greps for besides a function's name: calls and idioms found in many files.
COMMON = ("encoding=", ".decode(", "raise ValueError", "isinstance(", "os.path.join", "except OSError", "_cache")
GREP_TOOL = {
    "type": "function",
    "function": {
        "name": "grep",
        "description": "Search the repository for a regular expression",
        "parameters": {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]},
    },
}


# -- pricing ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pricing:
    """Input price per token as a share of the uncached price: `read` for the cached prefix,
    `write` for the rest (1 where writing costs nothing extra), cached from `minimum` tokens on,
    in steps of `granularity`."""

    name: str
    read: float
    write: float
    minimum: int = 1024
    granularity: int = 1

    def cost(self, tokens: int, shared: int) -> float:
        cached = shared if shared >= self.minimum else 0
        cached -= cached % self.granularity
        cached = min(cached, tokens)
        return cached * self.read + (tokens - cached) * self.write


OPENAI = Pricing("OpenAI-like", read=0.1, write=1.0, granularity=128)
ANTHROPIC = Pricing("Anthropic-like", read=0.1, write=1.25)


def shared_prefix(before: Sequence[tuple[Any, int]] | None, after: Sequence[tuple[Any, int]], fixed: int) -> int:
    """Tokens `after` shares with `before` from its start: `fixed` (the tools) and each whole
    message, (message, tokens), equal in both, up to the first that differs."""
    if before is None:
        return 0
    shared = fixed
    for (a, _), (b, tokens) in zip(before, after, strict=False):
        if a != b:
            break
        shared += tokens
    return shared


# -- sessions made of real content ------------------------------------------------------------


@dataclass
class Session:
    messages: list[dict[str, Any]]
    requests: list[int]  # each request is messages[:end]


def _identifiers(rng: random.Random, count: int) -> list[str]:
    names: set[str] = set()
    for path in rng.sample(_sources(), 12):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        names |= {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and len(n.name) > 6}
    return rng.sample(sorted(names), min(count, len(names)))


def grep(pattern: str, limit: int = 120) -> str:
    """Real `grep -n` output of `pattern` over the standard library's top-level modules."""
    lines = []
    expression = re.compile(re.escape(pattern))
    for path in _sources():
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if expression.search(line):
                lines.append(f"{path.name}:{n}:{line.strip()}")
                if len(lines) >= limit:
                    return "\n".join(lines)
    return "\n".join(lines) or "(no matches)"


def _docstrings(rng: random.Random, count: int) -> list[str]:
    found: list[str] = []
    for path in rng.sample(_sources(), 40):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except SyntaxError:
            continue
        doc = ast.get_docstring(tree)
        if doc and 300 < len(doc) < 2500:
            found.append(doc)
    return (found * count)[:count]


def session(steps: int, seed: int) -> Session:
    """One agent session of `steps` tool steps: a few tasks, each a user message, steps, an answer."""
    rng = random.Random(seed)
    slices = iter(file_slices(steps, seed, low=500, high=8000))
    names = iter(_identifiers(rng, steps))
    tasks = max(2, steps // 25)
    answers = iter(_docstrings(rng, tasks))
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    requests: list[int] = []
    bounds = sorted(rng.sample(range(1, steps), tasks - 1))
    for task, (start, end) in enumerate(zip([0, *bounds], [*bounds, steps], strict=True)):
        messages.append({"role": "user", "content": f"Task {task + 1}: " + _task(rng)})
        requests.append(len(messages))
        for k in range(start, end):
            call_id = f"call_{seed}_{k}"
            if rng.random() < 0.3 and (name := next(names, None)) is not None:
                pattern = name if rng.random() < 0.5 else rng.choice(COMMON)
                tool, arguments, result = "grep", {"pattern": pattern}, grep(pattern)
                line = f"Let me search for `{pattern}`."
            else:
                file, first, result = next(slices)
                tool, arguments = "read_file", {"path": file, "start_line": first}
                line = f"Now I read {file} from line {first}."
            call = {"id": call_id, "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}
            messages.append({"role": "assistant", "content": line, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": call_id, "content": result})
            requests.append(len(messages))
        messages.append({"role": "assistant", "content": next(answers)})
    return Session(messages, requests)


def _task(rng: random.Random) -> str:
    return rng.choice(
        [
            "find where the module decides the encoding of its input, and whether a wrong guess can pass silently.",
            "review how errors are reported in the parsing code and list the cases that lose the original message.",
            "trace how a path given by the user reaches the file system, and what is checked on the way.",
            "explain how the caching works in these modules and whether anything can grow without bound.",
            "look for places where text is split into lines and tell me which ones drop a trailing newline.",
        ]
    )


# -- trimmers ---------------------------------------------------------------------------------

Trimmer = Callable[[dict[str, Any]], tuple[dict[str, Any] | None, int]]  # body -> (forwarded or None, tokens)


@dataclass
class Measure:
    costs: dict[str, float] = field(default_factory=dict)
    refused: int = 0
    requests: int = 0
    users: list[int] = field(default_factory=lambda: [0, 0])  # verbatim, seen
    assistants: list[int] = field(default_factory=lambda: [0, 0])
    last_results: list[int] = field(default_factory=lambda: [0, 0])
    used: list[float] = field(default_factory=list)
    reuse: list[float] = field(default_factory=list)


def guard(
    profile: ModelProfile,
    tokenizer: Tokenizer,
    cache: CountCache,
    options: Mapping[str, Any] | None = None,
    names: Sequence[str] = DEFAULT_PIPELINE,
    mask: int | None = None,
) -> Trimmer:
    """The core's plan with a pipeline; with `mask`, every result but the newest `mask` replaced
    by the placeholder first (naive observation masking)."""
    policy = TrimPolicy(budget=BudgetPolicy(), pipeline=build_pipeline(names, dict(options or {})))
    counter = RequestCounter(profile, tokenizer, cache)

    def trim(body: dict[str, Any]) -> tuple[dict[str, Any] | None, int]:
        if mask is not None:
            body = masked(body, mask, counter)
        plan = plan_request(body, RequestCounter(profile, tokenizer, cache), policy)
        if plan.result.outcome not in ("unchanged", "trimmed"):
            return None, plan.result.tokens_after
        return dict(plan.result.body), plan.result.tokens_after

    return trim


def masked(body: dict[str, Any], keep: int, counter: RequestCounter) -> dict[str, Any]:
    messages = list(body["messages"])
    results = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    names = {c["id"]: c["function"]["name"] for m in messages for c in m.get("tool_calls") or ()}
    for i in results[: max(0, len(results) - keep)]:
        tokens = counter.message(messages[i], i).tokens
        messages[i] = {**messages[i], "content": placeholder(names.get(messages[i]["tool_call_id"]), tokens)}
    return {**body, "messages": messages}


def replay(sessions: Sequence[Session], trim: Trimmer | None, counter: RequestCounter, window: int) -> Measure:
    measure = Measure(costs={OPENAI.name: 0.0, ANTHROPIC.name: 0.0})
    tools = [CHAT_TOOL, GREP_TOOL]
    fixed = counter.request(
        {"model": "gpt-4o", "messages": [{"role": "user", "content": ""}], "tools": tools}
    ).fixed_tokens
    for one in sessions:
        previous: list[tuple[Any, int]] | None = None
        for end in one.requests:
            body = {"model": "gpt-4o", "messages": one.messages[:end], "tools": tools, "max_tokens": MAX_TOKENS}
            measure.requests += 1
            sent, _ = trim(body) if trim is not None else (body, 0)
            if sent is None:
                measure.refused += 1
                continue
            count = counter.request(sent)
            counted = [(m, c.tokens) for m, c in zip(sent["messages"], count.messages, strict=True)]
            shared = shared_prefix(previous, counted, fixed)
            for pricing in (OPENAI, ANTHROPIC):
                measure.costs[pricing.name] += pricing.cost(count.total, shared)
            _keeping(measure, body["messages"], sent["messages"])
            if sent["messages"] != body["messages"]:
                measure.used.append(count.total / window)
                measure.reuse.append(shared / count.total)
            previous = counted
    return measure


def _keeping(measure: Measure, original: Sequence[Mapping[str, Any]], sent: Sequence[Mapping[str, Any]]) -> None:
    kept = {json.dumps(m, sort_keys=True) for m in sent}
    results = [m for m in original if m["role"] == "tool"][-LAST:]
    for role, tally in (("user", measure.users), ("assistant", measure.assistants)):
        mine = [m for m in original if m["role"] == role]
        tally[0] += sum(1 for m in mine if json.dumps(m, sort_keys=True) in kept)
        tally[1] += len(mine)
    measure.last_results[0] += sum(1 for m in results if json.dumps(m, sort_keys=True) in kept)
    measure.last_results[1] += len(results)


# -- the run ----------------------------------------------------------------------------------


def trimmers(profile: ModelProfile, tokenizer: Tokenizer, cache: CountCache) -> dict[str, Trimmer]:
    before = tuple(n for n in DEFAULT_PIPELINE if n != "clear_tool_results")
    return {
        "context-guard default (keep_last 3, step_share 0.45)": guard(profile, tokenizer, cache),
        "clear_tool_results keep_last: 10": guard(profile, tokenizer, cache, {"clear_tool_results": {"keep_last": 10}}),
        "clear_tool_results step_share: 0.2": guard(
            profile, tokenizer, cache, {"clear_tool_results": {"step_share": 0.2}}
        ),
        "clear_tool_results step_share: 0.6": guard(
            profile, tokenizer, cache, {"clear_tool_results": {"step_share": 0.6}}
        ),
        "pipeline before clear_tool_results": guard(profile, tokenizer, cache, names=before),
        "naive masking, newest 10 (every request)": guard(profile, tokenizer, cache, mask=LAST),
    }


def measure(count: int) -> dict[int, dict[str, Measure]]:
    sessions = [session(steps, seed) for seed, steps in enumerate(STEPS[:count], start=1)]
    registry, tokenizers = ModelRegistry(load_model_map()), Tokenizers()
    out: dict[int, dict[str, Measure]] = {}
    for window in WINDOWS:
        profile = replace(registry.profile("gpt-4o"), context_window=window)
        tokenizer, cache = tokenizers.get(profile.tokenizer), CountCache()
        counter = RequestCounter(profile, tokenizer, cache)
        out[window] = {"untrimmed (as if it fit)": replay(sessions, None, counter, window)}
        for name, trim in trimmers(profile, tokenizer, cache).items():
            out[window][name] = replay(sessions, trim, counter, window)
            print(f"{window:>7,} {name}: done", file=sys.stderr)
    return out


def table(results: Mapping[int, Mapping[str, Measure]]) -> list[str]:
    head = [
        "window",
        "trimmer",
        "OpenAI-like cost",
        "Anthropic-like cost",
        "refused",
        "user msgs verbatim",
        "assistant msgs kept",
        f"last {LAST} results kept",
        "window used",
        "prefix reuse",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for window, arms in results.items():
        base = arms["untrimmed (as if it fit)"].costs
        for name, m in arms.items():
            if name.startswith("untrimmed"):
                continue
            cells = [f"{window // 1024}k", name]
            cells += [f"{m.costs[p] / base[p]:.2f}x" for p in (OPENAI.name, ANTHROPIC.name)]
            cells += [f"{m.refused} of {m.requests}"]
            cells += [f"{t[0] / max(t[1], 1):.1%}" for t in (m.users, m.assistants, m.last_results)]
            cells += [f"{sum(v) / len(v):.0%}" if v else "-" for v in (m.used, m.reuse)]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def section(results: Mapping[int, Mapping[str, Measure]], sessions: int) -> str:
    steps = ", ".join(str(s) for s in STEPS[:sessions])
    return "\n".join(
        [
            START,
            "## Agent sessions and prompt-cache cost (bench/agents.py)",
            "",
            f"{sessions} coding-agent sessions of real content ({steps} tool steps: standard library files and",
            "real grep output as tool results), every request replayed through the core at each window",
            f"(gpt-4o's tokenizer, `max_tokens` {MAX_TOKENS:,}). Cost: the input of every request priced with",
            "prompt caching, over the untrimmed conversation's as if the window held it. OpenAI-like: cached",
            "prefix at 0.1 (GPT-5's price; gpt-4o's is 0.5), from 1,024 tokens in steps of 128; Anthropic-like:",
            "cache reads 0.1, writes 1.25; a refused request is priced at nothing (it does nothing either).",
            "Kept: messages reaching the model verbatim, over all requests.",
            "Window used and prefix reuse: over the requests the trimmer changed. How clearing works:",
            "[trimming.md](trimming.md#agents-tool-results-cleared-in-cache-stable-blocks).",
            "",
            *table(results),
            END,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=len(STEPS), help="how many of the sessions to run")
    parser.add_argument("--print", action="store_true", help="print the section instead of writing it")
    args = parser.parse_args()
    text = section(measure(args.sessions), args.sessions)
    if args.print:
        print(text)
        return
    page = ROOT / "docs/benchmarks.md"
    write_section(page, text, START, END)
    print(f"wrote the agents section of {page}")


if __name__ == "__main__":
    main()
