"""The handler's own CPU for one warm 88 KB request, in-process, for one or more checkouts.

What `bench/warm.py` measures end to end, split: `parse` is the strict read of the body and the
chat adapter's parse with its field checks, as the handler runs them (`parse` for a body with a
new turn, `parse same` for the last body sent again as it was); `plan` is the count (the
cache holding the conversation's earlier turns), the budget and the trim decision with the
model's own tokenizer, as the handler asks for it. CPU time of this process (not wall time), the
least of 9 repetitions over 40 bodies, so that other work on a shared machine counts for little;
each checkout runs in its own process, the checkouts interleaved round by round.

Run: python bench/warm_core.py --guard before=/tmp/base --guard after=. [--rounds 3]
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent
BODIES = 40
CONFIG = "upstreams:\n  fake:\n    base_url: http://127.0.0.1:9/v1\nroutes:\n  - match: gpt-4.1\n    upstream: fake\n"


def measure(config: str) -> dict[str, float]:
    """In a process whose `proxy` is the checkout's: the two figures, in microseconds per request."""
    from bench.load import Bodies
    from proxy.apis.registry import AdapterRegistry
    from proxy.config.settings import load_settings
    try:  # an older checkout named the module after its counting
        from proxy.server.backends.models import Models
    except ImportError:
        from proxy.server.backends.model_counting import Models
    try:  # an older checkout kept the strict reader apart from the codec
        from proxy.wire import strict_json as strict_reader
    except ImportError:
        from proxy.wire import codec as strict_reader

    guard = Models(load_settings(config))
    memory = guard.settings.server.prefix_memory_bytes
    try:  # the readers apart from the registry (session 23 on); before, the registry read the bodies
        from proxy.wire.readers import BodyReaders

        registry = AdapterRegistry()
        readers: Any = BodyReaders(registry.adapters, prefix_memory_bytes=memory)
    except ImportError:
        old = hasattr(AdapterRegistry, "read")
        registry = AdapterRegistry(None, prefix_memory_bytes=memory) if old else AdapterRegistry()  # type: ignore[call-arg]
        readers = registry
    resends = hasattr(readers, "read")
    endpoint = registry.endpoint_for("/v1/chat/completions")
    assert endpoint is not None
    profile = guard.profile("gpt-4.1")
    counted = getattr(guard, "counted_as", None)  # `Counting`; a (profile, tokenizer) pair in older trees
    shared = {"shared_cache": True} if "shared_cache" in inspect.signature(guard.fit).parameters else {}
    if counted is not None:
        counting, leading = counted("gpt-4.1"), ()
    else:
        counting, leading = (profile, guard.tokenizer(profile)), ("gpt-4.1",)

    def parse(raw: bytes) -> Any:
        if resends:  # as the handler reads: a re-sent conversation parsed only where it is new
            reading = readers.read(endpoint.adapter, raw)
            parsed = endpoint.parse(reading.value, reading.known)
            readers.accepted(endpoint.adapter, reading)
            return parsed
        if hasattr(strict_reader, "read_json"):
            return endpoint.parse(strict_reader.read_json(raw))
        from proxy.apis.openai.chat_checks import check_chat_body  # before one reader: the handler's three steps

        data = strict_reader.loads_strict(raw)
        check_chat_body(data)
        return endpoint.parse(data)

    def plan(parsed: Any) -> Any:
        return guard.fit(endpoint.adapter, parsed, *leading, None, counting, **shared)

    bodies = Bodies.of_size(88_000)
    plan(parse(bodies.base))  # the conversation's earlier turns in the cache
    raws = [bodies.warm() for _ in range(BODIES)]
    parsed = [parse(raw) for raw in raws]

    def best(work: Any) -> float:
        return min(timeit.repeat(work, number=1, repeat=9, timer=time.process_time)) / BODIES * 1e6

    figures = {
        "parse_us": best(lambda: [parse(raw) for raw in raws]),
        "plan_us": best(lambda: [plan(p) for p in parsed]),
    }
    last = raws[-1]
    parse(last)  # kept: the body about to be sent again as it was
    figures["parse_same_us"] = best(lambda: [parse(last) for _ in raws])
    return figures


def least_per_tree(script: Path, guards: list[str], rounds: int, arguments: list[str]) -> dict[str, dict[str, float]]:
    """`script arguments` run in each NAME=SOURCE_TREE's checkout in turn, `rounds` times (its own
    process, its `proxy` first on the path); the least of each figure (the JSON its last line prints)."""
    trees = {name: Path(tree).resolve() for name, tree in (g.split("=", 1) for g in guards)}
    best: dict[str, dict[str, float]] = {}
    for _ in range(rounds):
        for name, tree in trees.items():
            out = subprocess.run(
                [sys.executable, str(script.resolve()), *arguments],
                cwd=tree,
                env={**os.environ, "PYTHONPATH": str(tree)},
                capture_output=True,
                text=True,
                check=True,
            )
            figures = json.loads(out.stdout.strip().splitlines()[-1])
            kept = best.setdefault(name, figures)
            for key, value in figures.items():
                kept[key] = min(kept[key], value)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--guard", action="append", default=[], help="NAME=SOURCE_TREE (repeatable)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # a config path: measure in this process
    args = parser.parse_args()
    if args.measure:
        sys.path[:0] = [os.getcwd(), str(ROOT)]  # the checkout's proxy; bench.load from here if it has none
        print(json.dumps(measure(args.measure)))
        return
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "context-guard.yaml"
        config.write_text(CONFIG)
        best = least_per_tree(Path(__file__), args.guard, args.rounds, ["--measure", str(config)])
    for name, figures in best.items():
        parse, plan, same = figures["parse_us"], figures["plan_us"], figures.get("parse_same_us", float("nan"))
        totals = f"parse {parse:7.0f} us  plan {plan:7.0f} us  total {parse + plan:7.0f} us"
        print(f"{name:12s} {totals}  parse same {same:5.0f} us")


if __name__ == "__main__":
    main()
