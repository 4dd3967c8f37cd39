"""Counting throughput on a 1M-token conversation, against raw tiktoken in the same run.

Prints, for one body of about a million tokens (prose, code, JSON tool results, CJK):
- cold: context-guard's full chat-format count with an empty cache, as a throughput ratio to
  raw `encode_ordinary` on the same text concatenated (target >= 0.8x);
- warm: the same conversation re-sent with one new turn, the cache filled by the previous
  request (target >= 20x faster than cold);
- litellm's `token_counter` on the same body (imported here only; the proxy never imports it).

Run: python bench/counting.py [--tokens N] [--repeat N] [--no-litellm]
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent))

from bench.conversations import agent_conversation, all_text
from proxy.core.models import ModelRegistry
from proxy.core.tokenizer import CountCache
from proxy.core.tokens import RequestCounter
from proxy.encodings import Tokenizers
from proxy.model_map import load_model_map


def best_of(repeat: int, fn) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-litellm", action="store_true")
    args = parser.parse_args()

    body = agent_conversation(args.tokens)
    registry = ModelRegistry(load_model_map())
    profile = registry.profile(body["model"])
    tokenizer = Tokenizers().get(profile.tokenizer)
    import tiktoken

    encoding = tiktoken.get_encoding(profile.tokenizer.source)
    text = all_text(body)

    raw_s = best_of(args.repeat, lambda: encoding.encode_ordinary(text))
    raw_tokens = len(encoding.encode_ordinary(text))

    def cold() -> int:
        return RequestCounter(profile, tokenizer, CountCache()).request(body).total

    cold_s = best_of(args.repeat, cold)
    total = cold()

    cache = CountCache()
    RequestCounter(profile, tokenizer, cache).request(body)
    grown = copy.copy(body)
    grown["messages"] = [
        *body["messages"],
        {"role": "assistant", "content": "Here is the summary."},
        {"role": "user", "content": "Thanks. Now list the open risks."},
    ]
    warm_counter = RequestCounter(profile, tokenizer, cache)
    # A warm count takes milliseconds, so a stray scheduler hiccup moves it a lot: take more runs.
    warm_s = best_of(args.repeat * 4, lambda: warm_counter.request(grown))

    print(
        f"conversation: {len(body['messages'])} messages, {total:,} prompt tokens ({raw_tokens:,} in the raw text), "
        f"{len(text.encode()) / 1e6:.1f} MB of text, model {body['model']} ({tokenizer.name})"
    )
    print(f"{'measure':44} {'seconds':>9} {'ratio':>10}")
    print(f"{'baseline: raw tiktoken encode_ordinary':44} {raw_s:9.3f} {'1.00x':>10}")
    print(f"{'context-guard cold (empty cache)':44} {cold_s:9.3f} {raw_s / cold_s:9.2f}x  vs raw (target >= 0.8x)")
    print(f"{'context-guard warm (one new turn)':44} {warm_s:9.4f} {cold_s / warm_s:9.1f}x  vs cold (target >= 20x)")

    if not args.no_litellm:
        os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        start = time.perf_counter()
        import litellm

        import_s = time.perf_counter() - start
        ll_s = best_of(
            1, lambda: litellm.token_counter(model=body["model"], messages=body["messages"], tools=body["tools"])
        )
        ll_tokens = litellm.token_counter(model=body["model"], messages=body["messages"], tools=body["tools"])
        print(
            f"{'litellm.token_counter':44} {ll_s:9.3f} {raw_s / ll_s:9.2f}x  throughput vs raw; "
            f"counts {ll_tokens:,} vs our {total:,} (import took {import_s:.1f} s)"
        )
    print(f"(best of {args.repeat} runs each, {args.repeat * 4} for warm; the machine has {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
