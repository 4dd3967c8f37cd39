"""Before and after of the per-request glue that depends on nothing in the request, alternated in
one process: a request id (`secrets.token_hex`, a `getrandom` system call each, against a counter
on a per-process random prefix) and a model's route (the routes' globs tried in order for every
request, against the router's table of models already routed).

CPU time of this process (`time.process_time`), the least of `--rounds` alternations of `--number`
calls each, old and new taking turns: on a loaded machine the least is the figure least touched by
other work. The old code is written out here as it was (main at a97417b), so that both run in the
same process on the same inputs.

Run: python bench/glue_micro.py [--rounds 40] [--number 20000]
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from proxy.config.settings import settings_from_dict  # noqa: E402
from proxy.server.backends.models import Router, Target  # noqa: E402
from proxy.server.request.flow import new_request_id  # noqa: E402

ROUTES = [
    {"match": "gpt-4o", "upstream": "fake"},
    {"match": "claude-*", "upstream": "fake"},
    {"match": "llama-*", "upstream": "fake"},
    {"match": "qwen*", "upstream": "fake"},
    {"match": "gpt-4.1*", "upstream": "fake"},
]


def old_route(router: Router, model: str) -> Target:
    """`Router.route` before session 23: every route tried, a new Target each time."""
    for route in router.routes:
        if route.matches(model):
            return Target(router.upstreams[route.upstream], route.rename or model)
    raise LookupError(model)


def least_us(rounds: int, number: int, pairs: dict[str, tuple[Callable[[], object], Callable[[], object]]]) -> None:
    for name, (old, new) in pairs.items():
        best = {"before": float("inf"), "after": float("inf")}
        for _ in range(rounds):
            for label, work in (("before", old), ("after", new)):
                started = time.process_time()
                for _ in range(number):
                    work()
                best[label] = min(best[label], (time.process_time() - started) / number * 1e6)
        print(f"{name:40s} before {best['before']:6.2f} us  after {best['after']:6.2f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--number", type=int, default=20_000)
    args = parser.parse_args()
    settings = settings_from_dict(
        {"upstreams": {"fake": {"base_url": "http://127.0.0.1:9/v1"}}, "routes": ROUTES}, "bench.yaml", {}
    )
    router = Router(settings)
    least_us(
        args.rounds,
        args.number,
        {
            "request id": (lambda: secrets.token_hex(16), new_request_id),
            "route, model matching the 1st route": (
                lambda: old_route(router, "gpt-4o"),
                lambda: router.route("gpt-4o"),
            ),
            "route, model matching the 5th route (glob)": (
                lambda: old_route(router, "gpt-4.1-mini"),
                lambda: router.route("gpt-4.1-mini"),
            ),
        },
    )


if __name__ == "__main__":
    main()
