"""What the core costs on one thread, with no server around it: counting and trim-heavy requests.

- counting: a 1M-token conversation (prose, code, JSON tool results, CJK) counted cold, on one
  thread, against tiktoken's `encode_ordinary` on the same text concatenated, on one thread.
  Every repetition starts from an empty cache. The encode pool's gain (large texts split over
  the cores) is a line of its own, against the same single-threaded count.
- warm: the same conversation re-sent with one new turn; every repetition starts from a cache
  that holds only the previous turn's conversation, so nothing of the new turn is cached.
- trim-heavy: 1M tokens in 2,000 messages cut to a 128k window, split into parse (bytes to
  objects), count (cold), decide (the trim pipeline) and serialise (the new body to bytes).

Each figure is the median of its repetitions; the counting ratios are taken round by round, the
least / median / greatest of them printed beside each. Run alone: python bench/core_speed.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent.parent))

from bench.conversations import agent_conversation, all_text
from bench.rounds import Spread, listed
from proxy.core.counting.count_cache import CountCache
from proxy.core.counting.request_count import RequestCounter
from proxy.core.counting.tokenizer import EncoderTokenizer, Tokenizer
from proxy.core.models.model_registry import ModelRegistry, TokenizerSpec
from proxy.core.plan import TrimPolicy, trim
from proxy.tokenizers.model_map import load_model_map
from proxy.tokenizers.vocabularies import Tokenizers
from proxy.wire import codec


def median_seconds(repeat: int, run: Callable[[], object], setup: Callable[[], object] | None = None) -> float:
    """The median time of `run()` over `repeat` runs, each after its own untimed `setup()`."""
    times = []
    for _ in range(repeat):
        if setup is not None:
            setup()
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def interleaved(repeat: int, *runs: Callable[[], object]) -> list[list[float]]:
    """The times of each of `runs`, run in turn `repeat` times (the order rotating)."""
    times: list[list[float]] = [[] for _ in runs]
    for i in range(repeat):
        for k in range(len(runs)):
            j = (i + k) % len(runs)
            started = time.perf_counter()
            runs[j]()
            times[j].append(time.perf_counter() - started)
    return times


def counting(registry: ModelRegistry, tokenizers: Tokenizers, repeat: int) -> dict[str, Any]:
    body = agent_conversation(1_000_000)
    profile = registry.profile(body["model"])
    pooled = tokenizers.get(profile.tokenizer)
    assert isinstance(pooled, EncoderTokenizer)
    single: Tokenizer = EncoderTokenizer(pooled.base_name, pooled.encode, pooled.multiplier, None)
    text = all_text(body)
    total = RequestCounter(profile, single, CountCache()).request(body).total
    # Interleaved, run by run: on a shared machine a slow second would otherwise land on one side.
    raw, cold, pool = interleaved(
        repeat,
        lambda: pooled.encode(text),
        lambda: RequestCounter(profile, single, CountCache()).request(body),
        lambda: RequestCounter(profile, pooled, CountCache()).request(body),
    )
    raw_s, cold_s, pool_s = (statistics.median(t) for t in (raw, cold, pool))

    grown = {**body, "messages": [*body["messages"], {"role": "assistant", "content": "Here is the summary."}]}
    caches: list[CountCache] = []

    def primed() -> None:  # a cache that has seen the previous turn only
        caches.append(CountCache())
        RequestCounter(profile, single, caches[-1]).request(body)

    def warm_count() -> None:
        new_turn = {"role": "user", "content": f"Thanks. Now list the open risks ({len(caches)})."}
        RequestCounter(profile, single, caches[-1]).request({**grown, "messages": [*grown["messages"], new_turn]})

    warm_s = median_seconds(repeat * 3, warm_count, primed)
    return {
        "messages": len(body["messages"]),
        "tokens": total,
        "text_mb": len(text.encode()) / 1e6,
        "raw_encode_s": raw_s,
        "cold_one_thread_s": cold_s,
        "cold_ratios": [r / c for r, c in zip(raw, cold, strict=True)],  # round by round
        "cold_pool_s": pool_s,
        "pool_gains": [c / p for c, p in zip(cold, pool, strict=True)],
        "warm_s": warm_s,
        "warm_speedup": cold_s / warm_s,
    }


def trim_heavy(registry: ModelRegistry, tokenizers: Tokenizers, repeat: int) -> dict[str, Any]:
    body = agent_conversation(1_000_000, tokens_per_turn_estimate=2000, repeat=2)
    body["model"] = "gpt-4o"
    raw = codec.dumps(body)
    profile = registry.profile("gpt-4o")
    pooled = tokenizers.get(profile.tokenizer)
    assert isinstance(pooled, EncoderTokenizer)
    single = EncoderTokenizer(pooled.base_name, pooled.encode, pooled.multiplier, None)
    policy = TrimPolicy()
    phases: dict[str, list[float]] = {"parse": [], "count": [], "decide": [], "serialise": []}
    result = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        parsed = codec.loads(raw)
        t1 = time.perf_counter()
        counter = RequestCounter(profile, single, CountCache())
        count = counter.request(parsed)
        t2 = time.perf_counter()
        result = trim(parsed, count, counter, policy, profile.context_window)
        t3 = time.perf_counter()
        codec.dumps(result.body)
        t4 = time.perf_counter()
        for name, seconds in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            phases[name].append(seconds)
    assert result is not None
    return {
        "messages": len(body["messages"]),
        "body_mb": len(raw) / 1e6,
        "tokens_before": result.tokens_before,
        "tokens_after": result.tokens_after,
        "window": profile.context_window,
        "removals": len(result.removals),
        **{f"{name}_ms": statistics.median(times) * 1000 for name, times in phases.items()},
    }


def run(quick: bool) -> dict[str, Any]:
    registry = ModelRegistry(load_model_map())
    tokenizers = Tokenizers()
    tokenizers.get(TokenizerSpec("tiktoken", "o200k_base"))
    repeat = 2 if quick else 7
    return {"counting": counting(registry, tokenizers, repeat), "trim_heavy": trim_heavy(registry, tokenizers, repeat)}


def rows(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """`run`'s figures as rows of `make bench`'s table."""
    c, t = figures["counting"], figures["trim_heavy"]
    scenario = f"counting, {c['tokens']:,} tokens in {c['messages']:,} messages ({c['text_mb']:.1f} MB of text)"
    trim_scenario = (
        f"trim-heavy, {t['tokens_before']:,} tokens / {t['messages']:,} messages to a {t['window']:,} window"
    )
    return [
        {
            "scenario": scenario,
            "metric": "cold throughput vs encode_ordinary, one thread each",
            "bare": c["raw_encode_s"],
            "guard": c["cold_one_thread_s"],
            "unit": "s",
            "ratio": statistics.median(c["cold_ratios"]),
            "spread": listed(Spread.of(c["cold_ratios"])),
            "ratio_meaning": "throughput",
            "target": ">= 0.8x",
        },
        {
            "scenario": scenario,
            "metric": "encode pool's gain over one thread (cold)",
            "bare": c["cold_one_thread_s"],
            "guard": c["cold_pool_s"],
            "unit": "s",
            "ratio": statistics.median(c["pool_gains"]),
            "spread": listed(Spread.of(c["pool_gains"])),
            "ratio_meaning": "speedup",
        },
        {
            "scenario": scenario,
            "metric": "warm (one new turn) vs cold, one thread",
            "bare": c["cold_one_thread_s"],
            "guard": c["warm_s"],
            "unit": "s",
            "ratio": c["warm_speedup"],
            "ratio_meaning": "speedup",
        },
        *(
            {
                "scenario": trim_scenario,
                "metric": phase,
                "bare": None,
                "guard": t[f"{phase}_ms"],
                "unit": "ms",
                "ratio": None,
            }
            for phase in ("parse", "count", "decide", "serialise")
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    for section, figures in run(args.quick).items():
        print(section)
        for key, value in figures.items():
            if isinstance(value, list):  # a ratio per round
                shown = " ".join(f"{v:.3g}" for v in value)
            else:
                shown = f"{value:,.4g}" if isinstance(value, float) else f"{value:,}"
            print(f"  {key:20} {shown}")


if __name__ == "__main__":
    main()
