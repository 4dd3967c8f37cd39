"""Multi-turn trimming: growing conversations re-sent turn after turn, as real clients send them.

A chat client or an agent re-sends its whole history with every request and lets the guard cut
it. Each seeded conversation below (chat, agent with tools and large tool results, CJK, images)
grows past the window; every request of it goes through each trimmer in turn, and each trimmer's
forwarded requests are compared with its own previous forwarded request. Per trimmer and window:

- fit+valid: share of requests whose forwarded messages fit the input budget (counted exactly
  with our counter) and form a valid request: no orphaned tool result, no call missing a
  result, history opening on a user turn, the latest user message and the system messages kept;
- room kept: on trimmed requests (those over budget as sent), forwarded tokens over the room
  (window - output reserve), mean; and the mean forwarded tokens themselves. A request that is
  not fit+valid keeps nothing: the provider refuses it (over the window, a tool result without
  its call) or it answers another question (the latest user message lost), so it counts as 0
  tokens. Every trimmer is averaged over the same trimmed requests; "valid only" is the mean
  over each trimmer's own valid requests, for reference (a trimmer that fails on the hard
  requests looks better there than it is);
- prefix reuse: on trimmed requests, the tokens shared as a prefix with the previous forwarded
  request of the same conversation (whole messages from the start, and the tool definitions),
  over the forwarded tokens;
- input cost of all requests under published prompt-cache pricing, as a share of the same
  tokens at full price: OpenAI (gpt-4o: cached input at half price, for prefixes of 1,024 tokens
  or more, in steps of 128) and Anthropic (cache reads at 10%, cache writes at 125%, prefixes of
  1,024 tokens or more).

Variants of context-guard: the defaults (the opening kept, `head_share` 0.75 of the budget, then
a cut on cache-stable positions down to the low-water mark 0.8, the turns across both kept in
part); "no opening" (`head_share: 0, low_water: 0.7`: the defaults before the opening); "minimal
cuts" (`head_share: 0, low_water: 1.0, keep_partial: false`: no deeper than needed, as before
cache-stable cuts); "+ summaries" (`summarize_dropped` and `budget_note`, with a stand-in
summariser of fixed-size summaries behind the same cache by span hash as the server's; it also
counts how often the dropped span changed, so that "once per cut" can be checked).

Peers, on the same requests in the same run: LangChain `trim_messages` (strategy "last",
include_system, start_on "human", given our exact per-message counts; its output is mapped back
to the original messages by id, so no conversion of ours can make it look invalid), litellm
`trim_messages` (its own counter, given the same input budget), and a naive trimmer that drops
the oldest non-system message until the request fits.

Run: python bench/multiturn.py [--seed S] [--conversations N] [--markdown docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import random
import re
import sys
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent))

from bench.conversations import GROWING_KINDS, growing_conversation
from proxy.core.counting.count_cache import CountCache
from proxy.core.counting.request_count import RequestCounter
from proxy.core.models.model_registry import ModelProfile, ModelRegistry
from proxy.core.plan import TrimPolicy, trim
from proxy.core.trimming.budget import (
    PINNED_ROLES,
    BudgetPolicy,
    SummaryStatus,
    default_reserve,
    input_budget,
    latest_user_index,
)
from proxy.core.trimming.compaction import CompactionPolicy, SummaryRequest, summary_request, with_summary
from proxy.core.trimming.strategies import DEFAULT_PIPELINE, build_pipeline
from proxy.core.trimming.trim import Strategy
from proxy.core.trimming.turns import validity_problems
from proxy.tokenizers.model_map import load_model_map
from proxy.tokenizers.vocabularies import Tokenizers

Messages = list[dict[str, Any]]
Trimmer = Callable[[dict[str, Any], int], Messages]
WINDOWS = {"8k": (8192, 24_000), "128k": (128_000, 190_000)}  # window, size the conversations grow to
OPENAI_CACHED_PRICE, OPENAI_MIN_PREFIX, OPENAI_STEP = 0.5, 1024, 128
ANTHROPIC_READ_PRICE, ANTHROPIC_WRITE_PRICE, ANTHROPIC_MIN_PREFIX = 0.1, 1.25, 1024
SECTION = "## bench/multiturn.py"
LEGEND = """Growing conversations (chat, agent with tools and large tool results, CJK, images) re-sent
turn after turn, every request through each trimmer. *trimmed*: requests over budget as sent.
*fit+valid*: share of all requests that fit the input budget (our exact count) and are valid
(no orphaned tool result or call without results, history opening on a user turn, latest user
message and system messages kept). *room kept*, *tokens kept*: on trimmed requests, forwarded
tokens over the window minus the output reserve, and their mean, a request that is not
fit+valid counting as 0 (the provider refuses it, or it answers another question); *valid only*:
the mean over the trimmer's own valid trimmed requests. *prefix reuse*: on trimmed requests,
tokens shared as a prefix with the previous forwarded request of the conversation, over
forwarded tokens. *OpenAI cost*, *Anthropic*: all requests' input cost under prompt-cache
pricing (OpenAI cached input at half price; Anthropic cache reads 10%, writes 125%), as a share
of full price. Every trimmer gets the same input budget (window - output reserve - safety
margin). Variants: the defaults keep the opening (`head_share: 0.75`) and cut on cache-stable
positions (`low_water: 0.8`); *no opening* is `head_share: 0, low_water: 0.7` (the defaults
before); *minimal cuts* is `head_share: 0, low_water: 1.0, keep_partial: false` (no deeper than
needed); *+ summaries* adds `summarize_dropped` and `budget_note`, with a stand-in summariser
behind a cache by span hash."""
# litellm recounts the whole kept history for every message it considers: over ten minutes for one
# 190k-token conversation on this machine, so it runs on the 8k window only.
LITELLM_WINDOWS = ("8k",)


@dataclass
class Tally:
    requests: int = 0
    fit_valid: int = 0
    trimmed: int = 0
    trimmed_ok: int = 0
    kept_share: float = 0.0  # over every trimmed request, a failed one counting 0
    kept_tokens: int = 0  # the same, in tokens
    forwarded_trimmed: int = 0
    reused_trimmed: int = 0
    full_price: int = 0
    openai_cost: float = 0.0
    anthropic_cost: float = 0.0
    seconds: float = 0.0
    failures: dict[str, int] = field(default_factory=dict)


class Bench:
    def __init__(self, profile: ModelProfile, counter: RequestCounter, policy: BudgetPolicy) -> None:
        self.profile = profile
        self.counter = counter
        self.policy = policy

    def budget(self, body: Mapping[str, Any]) -> int:
        return input_budget(self.profile.context_window, body, 0, 0, self.policy).input_budget

    def room(self) -> int:
        return self.profile.context_window - default_reserve(self.profile.context_window, self.policy)


@dataclass
class Summaries:
    """A stand-in summariser with the server's cache: a fixed-size text per span hash."""

    produced: int = 0
    reused: int = 0
    cuts: int = 0  # requests whose dropped span differs from the previous request's
    last_span: str = ""
    cache: dict[str, str] = field(default_factory=dict)

    def summarise(self, request: SummaryRequest) -> tuple[str, SummaryStatus]:
        if request.span_hash != self.last_span:
            self.cuts += 1
            self.last_span = request.span_hash
        if request.span_hash in self.cache:
            self.reused += 1
            return self.cache[request.span_hash], "reused"
        self.produced += 1
        text = f"Summary of {len(request.indices)} messages ({request.span_hash}): " + "facts and decisions. " * 40
        self.cache[request.span_hash] = text
        return text, "produced"


def context_guard(
    bench: Bench,
    pipeline: Sequence[Strategy],
    compaction: CompactionPolicy | None = None,
    summaries: Summaries | None = None,
) -> Trimmer:
    policy = TrimPolicy(bench.policy, tuple(pipeline), compaction=compaction or CompactionPolicy())

    def run(body: dict[str, Any], budget: int) -> Messages:
        count = bench.counter.request(body)
        result = trim(body, count, bench.counter, policy, bench.profile.context_window)
        span = summary_request(body, result) if summaries is not None else None
        if summaries is not None and span is not None:
            text, status = summaries.summarise(span)
            result = with_summary(result, span, text, status, bench.counter)
        return list(result.body["messages"])

    return run


def naive_drop_oldest(bench: Bench) -> Trimmer:
    def run(body: dict[str, Any], budget: int) -> Messages:
        count = bench.counter.request(body)
        messages = list(body["messages"])
        tokens = [m.tokens for m in count.messages]
        total = count.total
        i = 0
        while total > budget and i < len(messages) - 1:
            if messages[i].get("role") not in PINNED_ROLES:
                total -= tokens[i]
                del messages[i], tokens[i]
            else:
                i += 1
        return messages

    return run


def langchain(bench: Bench) -> Trimmer:
    from langchain_core.messages import convert_to_messages
    from langchain_core.messages import trim_messages as lc_trim

    def run(body: dict[str, Any], budget: int) -> Messages:
        originals = body["messages"]
        count = bench.counter.request(body)
        per_message = [m.tokens for m in count.messages]
        converted = convert_to_messages(originals)
        for i, message in enumerate(converted):
            message.id = str(i)  # to map what it keeps back to the original messages

        def exact(msgs: Sequence[Any]) -> int:
            return sum(per_message[int(m.id)] for m in msgs)

        kept = lc_trim(
            converted,
            max_tokens=budget - count.fixed_tokens,
            token_counter=exact,
            strategy="last",
            include_system=True,
            start_on="human",
            allow_partial=False,
        )
        return [originals[int(m.id)] for m in kept]

    return run


def litellm_trimmer(bench: Bench) -> Trimmer:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True

    def run(body: dict[str, Any], budget: int) -> Messages:
        # litellm prints a traceback and returns the messages untrimmed when it fails: keep the
        # output readable. It is given a copy, as it may change the messages in place.
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            out = litellm.utils.trim_messages(
                copy.deepcopy(body["messages"]), model="gpt-4o", trim_ratio=1.0, max_tokens=budget
            )
        return list(out if isinstance(out, list) else out[0])

    return run


def is_valid(original: Messages, forwarded: Messages) -> str | None:
    """Why `forwarded` is not a valid cut of `original`, or None."""
    if validity_problems(forwarded):
        return "structure"
    latest = original[latest_user_index(original) or 0]
    if not any(m is latest or m == latest for m in forwarded):
        return "latest user message changed or lost"
    kept_pinned = [m for m in forwarded if m.get("role") in PINNED_ROLES]
    if any(m not in kept_pinned for m in original if m.get("role") in PINNED_ROLES):
        return "system message lost"
    return None


def shared_prefix(previous: Messages, current: Messages, counts: Sequence[int]) -> int:
    """Tokens of the whole messages `current` shares with `previous` from the start."""
    shared = 0
    for i, (a, b) in enumerate(zip(previous, current, strict=False)):
        if a is not b and a != b:
            break
        shared += counts[i]
    return shared


def cached_tokens(prefix: int, minimum: int, step: int = 1) -> int:
    return 0 if prefix < minimum else prefix - prefix % step


def measure(
    bench: Bench, trimmers: Mapping[str, Trimmer], conversations: Sequence[list[dict[str, Any]]]
) -> dict[str, Tally]:
    tallies = {name: Tally() for name in trimmers}
    room = bench.room()
    for bodies in conversations:
        previous: dict[str, Messages] = {}
        for body in bodies:
            budget = bench.budget(body)
            over = bench.counter.request(body).total > budget
            for name, trimmer in trimmers.items():
                tally = tallies[name]
                tally.requests += 1
                started = time.perf_counter()
                try:
                    forwarded = trimmer(body, budget)
                except Exception as exc:  # a trimmer that raises forwards nothing
                    reason = type(exc).__name__
                    tally.failures[reason] = tally.failures.get(reason, 0) + 1
                    continue
                tally.seconds += time.perf_counter() - started
                count = bench.counter.request({**body, "messages": forwarded})
                problem = is_valid(body["messages"], forwarded)
                if count.total > budget:
                    problem = problem or "over budget"
                if problem:
                    tally.failures[problem] = tally.failures.get(problem, 0) + 1
                else:
                    tally.fit_valid += 1
                counts = [m.tokens for m in count.messages]
                prefix = 0
                if name in previous:
                    prefix = shared_prefix(previous[name], forwarded, counts)
                    prefix += count.components["tool_definitions"] if prefix else 0
                previous[name] = forwarded
                tally.full_price += count.total
                openai_cached = cached_tokens(prefix, OPENAI_MIN_PREFIX, OPENAI_STEP)
                tally.openai_cost += count.total - openai_cached * (1 - OPENAI_CACHED_PRICE)
                anthropic_read = cached_tokens(prefix, ANTHROPIC_MIN_PREFIX)
                tally.anthropic_cost += (
                    anthropic_read * ANTHROPIC_READ_PRICE + (count.total - anthropic_read) * ANTHROPIC_WRITE_PRICE
                )
                if over:
                    tally.trimmed += 1
                    tally.forwarded_trimmed += count.total
                    tally.reused_trimmed += prefix
                    if not problem:  # a request the provider refuses, or that lost its question, keeps nothing
                        tally.trimmed_ok += 1
                        tally.kept_share += count.total / room
                        tally.kept_tokens += count.total
    return tallies


def table(window: str, bench: Bench, tallies: Mapping[str, Tally]) -> list[str]:
    budget = bench.budget({})
    lines = [
        f"{window} window ({bench.profile.context_window:,} tokens; room {bench.room():,}, input budget {budget:,})",
        f"  {'trimmer':30} {'requests':>8} {'trimmed':>7} {'fit+valid':>9} {'room kept':>9} {'tokens kept':>11}"
        f" {'valid only':>10} {'prefix reuse':>12} {'OpenAI cost':>11} {'Anthropic':>9} {'ms/req':>7}",
    ]
    for name, t in tallies.items():
        trimmed, valid = max(t.trimmed, 1), max(t.trimmed_ok, 1)
        lines.append(
            f"  {name:30} {t.requests:8d} {t.trimmed:7d} {t.fit_valid / max(t.requests, 1):9.1%}"
            f" {t.kept_share / trimmed:9.1%} {t.kept_tokens / trimmed:11,.0f} {t.kept_tokens / valid:10,.0f}"
            f" {t.reused_trimmed / max(t.forwarded_trimmed, 1):12.1%}"
            f" {t.openai_cost / max(t.full_price, 1):11.1%} {t.anthropic_cost / max(t.full_price, 1):9.1%}"
            f" {t.seconds * 1000 / max(t.requests, 1):7.2f}"
        )
    for name, t in tallies.items():
        if t.failures:
            reasons = ", ".join(f"{reason}: {n}" for reason, n in sorted(t.failures.items()))
            lines.append(f"  {name} failures: {reasons}")
    return lines


def trimmers_for(bench: Bench, window: str, summaries: Summaries) -> dict[str, Trimmer]:
    no_opening = {"drop_oldest_turns": {"head_share": 0, "low_water": 0.7}}
    minimal = {"drop_oldest_turns": {"head_share": 0, "low_water": 1.0, "keep_partial": False}}
    pipeline = build_pipeline(DEFAULT_PIPELINE)
    trimmers = {
        "context-guard": context_guard(bench, pipeline),
        "context-guard, no opening": context_guard(bench, build_pipeline(DEFAULT_PIPELINE, no_opening)),
        "context-guard, minimal cuts": context_guard(bench, build_pipeline(DEFAULT_PIPELINE, minimal)),
        "context-guard + summaries": context_guard(
            bench, pipeline, CompactionPolicy(summarize_dropped=True, budget_note=True), summaries
        ),
        "naive drop-oldest": naive_drop_oldest(bench),
        "langchain trim_messages": langchain(bench),
    }
    if window in LITELLM_WINDOWS:
        trimmers["litellm trim_messages"] = litellm_trimmer(bench)
    return trimmers


def run(seed: int, per_kind: int, windows: Sequence[str]) -> list[str]:
    warnings.filterwarnings("ignore")
    registry = ModelRegistry(load_model_map())
    tokenizers = Tokenizers()
    base = registry.profile("gpt-4o")
    lines = [
        f"seed {seed}; {per_kind} conversation(s) of each kind ({', '.join(GROWING_KINDS)}) per window;"
        f" model gpt-4o ({tokenizers.get(base.tokenizer).name}), the 8k window set on its profile"
    ]
    for window in windows:
        size, grow_to = WINDOWS[window]
        profile = replace(base, context_window=size)
        counter = RequestCounter(profile, tokenizers.get(profile.tokenizer), CountCache())
        bench = Bench(profile, counter, BudgetPolicy())
        rng = random.Random(f"{seed}-{window}")
        conversations = [growing_conversation(kind, rng, grow_to) for kind in GROWING_KINDS for _ in range(per_kind)]
        summaries = Summaries()
        tallies = measure(bench, trimmers_for(bench, window, summaries), conversations)
        lines += ["", *table(window, bench, tallies)]
        lines.append(
            f"  context-guard + summaries (and the budget note): {summaries.cuts} cuts (a dropped span"
            f" unlike the previous request's), {summaries.produced} summaries produced,"
            f" {summaries.reused} reused from the cache"
        )
    return lines


def write_section(path: Path, lines: Sequence[str], command: str) -> None:
    """Replace (or append) this benchmark's section of the markdown file with `lines`."""
    text = path.read_text(encoding="utf-8")
    body = f"{SECTION}\n\n{LEGEND}\n\n`{command}`\n\n```\n" + "\n".join(lines) + "\n```\n"
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: body + "\n", text, count=1)
    else:
        anchor = text.find("## Notes")
        text = text[:anchor] + body + "\n" + text[anchor:] if anchor >= 0 else text + "\n" + body
    path.write_text(text.rstrip("\n") + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--conversations", type=int, default=2, help="conversations of each kind per window")
    parser.add_argument("--windows", nargs="+", choices=list(WINDOWS), default=list(WINDOWS))
    parser.add_argument("--markdown", type=Path, help="write the figures into this file's multiturn section")
    args = parser.parse_args()
    lines = run(args.seed, args.conversations, args.windows)
    print("\n".join(lines))
    if args.markdown:
        command = f"python bench/multiturn.py --seed {args.seed} --conversations {args.conversations}"
        write_section(args.markdown, lines, command)


if __name__ == "__main__":
    main()
