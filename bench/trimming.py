"""Trimming quality against litellm and LangChain (its speed is in bench/core_speed.py).

On the same seeded, generated agent conversations, each cut to the same budget by context-guard,
`litellm.utils.trim_messages` and `langchain_core.messages.trim_messages` (both given their best
settings; LangChain is given our exact counter). For each tool: the share of results that are
valid requests (no orphaned tool results, no calls missing results, history opening on a user
turn, latest user message and system messages kept), the share that fit the budget (counted
exactly), and the mean history tokens kept in results that are valid and fit.

Messages are compared by their text, not by their JSON shape: LangChain hands content-part arrays
back as one joined string, which is the same request to the model. (Comparing shapes exactly
once made 30% of LangChain's results look invalid when every one of them was that conversion.)

Run: python bench/trimming.py [--conversations N] [--seed S]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent))

from bench.conversations import random_conversation
from proxy.core.counting.request_count import RequestCounter
from proxy.core.models.model_registry import ModelRegistry
from proxy.core.plan import TrimPolicy, trim
from proxy.core.trimming.budget import PINNED_ROLES, BudgetPolicy, latest_user_index
from proxy.core.trimming.turns import split_conversation, validity_problems
from proxy.tokenizers.model_map import load_model_map
from proxy.tokenizers.vocabularies import Tokenizers


def history_tokens(messages: list[dict[str, Any]], counter: RequestCounter) -> int:
    latest = latest_user_index(messages)
    return sum(
        counter.message(m, i).tokens
        for i, m in enumerate(messages)
        if m.get("role") not in PINNED_ROLES and i != latest
    )


def text_of(message: dict[str, Any]) -> str:
    """A message's text whatever its shape: a string, or text parts joined by newlines (as LangChain
    joins them when it converts its messages back to OpenAI's)."""
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def valid(original: list[dict[str, Any]], result: list[dict[str, Any]]) -> bool:
    latest = text_of(original[latest_user_index(original) or 0])
    return (
        not validity_problems(result)
        and any(m.get("role") == "user" and text_of(m) == latest for m in result)
        and [text_of(m) for m in result if m.get("role") in PINNED_ROLES]
        == [text_of(m) for m in original if m.get("role") in PINNED_ROLES]
    )


def quality(registry: ModelRegistry, tokenizers: Tokenizers, n: int, seed: int) -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    warnings.filterwarnings("ignore")
    import litellm

    litellm.suppress_debug_info = True
    from langchain_core.messages import convert_to_messages, convert_to_openai_messages
    from langchain_core.messages import trim_messages as lc_trim

    profile = registry.profile("gpt-4o")
    counter = RequestCounter(profile, tokenizers.get(profile.tokenizer))
    rng = random.Random(seed)

    # The budget is given directly, as to the others: no output reserve or margin on top.
    exact = TrimPolicy(budget=BudgetPolicy(reserve_min=0, reserve_max=0, reserve_ratio=0, safety_ratio=0))

    def ours(body: dict[str, Any], budget: int) -> list[dict[str, Any]]:
        count = counter.request(body)
        result = trim(body, count, counter, exact, budget)
        return list(result.body["messages"])

    def with_litellm(body: dict[str, Any], budget: int) -> list[dict[str, Any]]:
        # litellm prints a traceback and returns the messages untrimmed when it fails; keep the
        # benchmark's output readable by sending its chatter to /dev/null.
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            out = litellm.utils.trim_messages(body["messages"], model="gpt-4o", trim_ratio=1.0, max_tokens=budget)
        return out if isinstance(out, list) else out[0]

    def with_langchain(body: dict[str, Any], budget: int) -> list[dict[str, Any]]:
        def exact(msgs: list[Any]) -> int:
            return (
                counter.request({"messages": convert_to_openai_messages(msgs)}).total
                - profile.chat_format.reply_priming
            )

        kept = lc_trim(
            convert_to_messages(body["messages"]),
            max_tokens=budget - profile.chat_format.reply_priming,
            token_counter=exact,
            strategy="last",
            include_system=True,
            start_on="human",
            allow_partial=False,
        )
        return convert_to_openai_messages(kept)  # type: ignore[return-value]

    tools = {"context-guard": ours, "litellm.trim_messages": with_litellm, "langchain trim_messages": with_langchain}
    stats = {name: {"valid": 0, "fit": 0, "both": 0, "kept": 0, "errors": 0} for name in tools}
    cases = 0
    while cases < n:
        body = random_conversation(rng)
        count = counter.request(body)
        full = count.total
        # Only budgets that a valid result can meet: the pinned messages and the protected tail fit.
        conversation = split_conversation(body["messages"])
        floor = count.fixed_tokens + sum(
            count.messages[i].tokens for i in (*conversation.pinned, *conversation.protected)
        )
        budget = rng.randint(floor + 300, max(floor + 400, int(full * 0.7)))
        if full <= budget:
            continue
        cases += 1
        for name, tool in tools.items():
            try:
                result = tool(body, budget)
            except Exception:  # a tool that raises has produced no request at all
                stats[name]["errors"] += 1
                continue
            ok = valid(body["messages"], result)
            fits = counter.request({"messages": result}).total <= budget
            stats[name]["valid"] += ok
            stats[name]["fit"] += fits
            if ok and fits:
                stats[name]["both"] += 1
                stats[name]["kept"] += history_tokens(result, counter)
    print(f"\nquality: {n} generated agent conversations, each over its budget (seed {seed})")
    print(
        f"  {'tool':26} {'valid':>7} {'fit':>7} {'both':>7} {'errors':>7} {'history tokens kept (mean, valid+fit)':>40}"
    )
    for name, s in stats.items():
        print(
            f"  {name:26} {s['valid'] / n:7.0%} {s['fit'] / n:7.0%} {s['both'] / n:7.0%} {s['errors']:7d} "
            f"{s['kept'] / max(s['both'], 1):40,.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    registry = ModelRegistry(load_model_map())
    tokenizers = Tokenizers()
    quality(registry, tokenizers, args.conversations, args.seed)


if __name__ == "__main__":
    main()
