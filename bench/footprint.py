"""What a warm request's CPU is made of, measured two ways `make bench` does not (issue 28).

1. **Functions per request.** The bare proxy, the minimal proxy and context-guard each serve a warm
   88 KB conversation, one request in flight, under a `sys.setprofile` hook that counts, per
   request, the distinct Python functions (code objects) that ran, the distinct built-in
   functions, and all calls. A request runs from one `aiohttp.web_request.BaseRequest.__init__`
   to the next: what the server does after answering (its log line) belongs to the request before.
   The hook slows the servers down; it changes what is counted, not what runs.
2. **The guard's own job, caches warm or emptied.** In one process, the job of a warm request
   (`PrefixReader` match and read, the chat adapter's parse, the body kept, the count and the plan)
   timed for requests run back to back, then with the CPU caches emptied before each (a 32 MB
   copy and a walk over 60,000 objects), for the bench's 96-message conversation and for one of 24
   messages of 66 KB (each turn's result and answer four times longer). The
   serving process lies between the two: between one request's job and the next, the bodies it
   reads and writes and aiohttp's own work pass through the same caches.

Run: python bench/footprint.py [--requests N] [--only functions|job]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from bench.load import Bodies, Connection  # noqa: E402
from bench.processes import free_port, guard_config, python, server_command, started  # noqa: E402

COUNTS = "CG_FOOTPRINT_OUT"  # where a counted server writes its figures when sent SIGUSR1


class RequestFootprint:
    """A `sys.setprofile` hook: per request, the distinct Python functions and built-ins run, and
    the calls made (a coroutine resumed counts as a call: aiohttp's and the guard's alike)."""

    def __init__(self, first_call: Any) -> None:
        self.first_call = first_call  # the code object whose call starts a request
        self.functions: set[Any] = set()
        self.builtins: set[Any] = set()
        self.calls = 0
        self.requests: list[tuple[int, int, int]] = []

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            if code is self.first_call:
                self.request_ended()
            self.functions.add(code)
            self.calls += 1
        elif event == "c_call":
            self.builtins.add(getattr(arg, "__qualname__", arg))
            self.calls += 1

    def request_ended(self) -> None:
        if self.functions:
            self.requests.append((len(self.functions), len(self.builtins), self.calls))
        self.functions, self.builtins, self.calls = set(), set(), 0

    def medians(self) -> tuple[float, float, float]:
        return tuple(statistics.median(r[i] for r in self.requests) for i in range(3))  # type: ignore[return-value]


def serve_counted(argv: list[str]) -> None:
    """Run a server (`guard CONFIG PORT` or bench/servers.py's `bare|minimal PORT UPSTREAM`) under the
    hook; on SIGUSR1, write the medians of the requests since the last signal to $CG_FOOTPRINT_OUT."""
    from aiohttp import web_request

    hook = RequestFootprint(web_request.BaseRequest.__init__.__code__)

    def write(*_: Any) -> None:
        sys.setprofile(None)
        functions, builtins, calls = hook.medians() if hook.requests else (0, 0, 0)
        Path(os.environ[COUNTS]).write_text(f"{len(hook.requests)} {functions} {builtins} {calls}\n")
        hook.requests.clear()
        sys.setprofile(hook)

    signal.signal(signal.SIGUSR1, write)
    sys.setprofile(hook)
    if argv[0] == "guard":
        from proxy.cli import main as guard

        sys.argv = ["context-guard", "serve", "--config", argv[1], "--port", argv[2], "--workers", "1"]
        guard()
    else:
        from bench.servers import main as server

        server(argv)


async def _send(
    url: str, pid: int, out: Path, base: bytes, make: Any, requests: int
) -> tuple[int, float, float, float]:
    """`base`, then 50 bodies from `make` to warm up, then `requests` more counted; their medians."""
    connection = await Connection.open(url)
    try:
        await connection.post(base)
        for _ in range(50):  # warm: caches, the prefix reader, the plans of a body sent again
            await connection.post(make())
        os.kill(pid, signal.SIGUSR1)
        await asyncio.sleep(0.5)
        for _ in range(requests):
            await connection.post(make())
        os.kill(pid, signal.SIGUSR1)
        await asyncio.sleep(0.5)
    finally:
        await connection.close()
    n, functions, builtins, calls = out.read_text().split()
    return int(n), float(functions), float(builtins), float(calls)


def functions_per_request(requests: int) -> None:
    bodies = Bodies.of_size(88_000)
    same = bodies.warm()
    print("Functions per warm 88 KB request, one in flight (medians):")
    print(f"  {'server':8s} {'scenario':10s} {'python functions':>17s} {'built-ins':>10s} {'calls':>7s}")
    with tempfile.TemporaryDirectory() as folder:
        up = free_port()
        out = Path(folder) / "counts"
        os.environ[COUNTS] = str(out)  # the servers started below inherit it
        with started(server_command("upstream", up), up):
            for kind in ("bare", "minimal", "guard"):
                port = free_port()
                args = (
                    ["guard", str(guard_config(Path(folder), up)), str(port)]
                    if kind == "guard"
                    else [kind, str(port), f"http://127.0.0.1:{up}/v1"]
                )
                command = [*python(), str(Path(__file__)), "--serve-counted", *args]
                with started(command, port, "/readyz" if kind == "guard" else "/healthz") as (process, _):
                    url = f"http://127.0.0.1:{port}/v1"
                    for scenario, make in (("sent again", lambda: same), ("new turn", bodies.warm)):
                        counted = _send(url, process.pid, out, bodies.base, make, requests)
                        n, functions, builtins, calls = asyncio.run(counted)
                        figures = f"{functions:17.0f} {builtins:10.0f} {calls:7.0f}"
                        print(f"  {kind:8s} {scenario:10s} {figures}   ({n} requests)")


def _job_runner(bodies: Bodies) -> Any:
    """The job of one request of `bodies`' conversation (as the server runs it for a warm body on
    the event loop), as a function of the body's bytes."""
    from proxy.apis.fitting import Counting
    from proxy.apis.registry import AdapterRegistry
    from proxy.config.settings import settings_from_dict
    from proxy.server.backends.models import Models
    from proxy.wire.readers import BodyReaders

    upstreams = {"fake": {"base_url": "http://127.0.0.1:9/v1"}}
    settings = settings_from_dict(
        {"upstreams": upstreams, "routes": [{"match": "gpt-4.1", "upstream": "fake"}]}, "bench", {}
    )
    models = Models(settings)
    registry = AdapterRegistry()
    readers = BodyReaders(registry.adapters, prefix_memory_bytes=settings.server.prefix_memory_bytes)
    endpoint = registry.endpoint_for("/v1/chat/completions")
    assert endpoint is not None
    profile = models.profile("gpt-4.1")
    counting = Counting(profile, models.tokenizer(profile), model="gpt-4.1")

    def job(raw: bytes) -> Any:
        match = readers.match(endpoint.adapter, raw)
        reading = readers.read(endpoint.adapter, raw, match)
        parsed = endpoint.parse(reading.value, reading.known)
        readers.accepted(endpoint.adapter, reading, seen_whole=not parsed.unseen)
        return models.fit(endpoint.adapter, parsed, None, counting, ("client", b"x"))

    job(bodies.base)
    return job


class CacheFlusher:
    """Empties the CPU's data caches, as far as a program can: 32 MB copied, 60,000 objects read."""

    def __init__(self) -> None:
        self.block = bytes(32 * 1024 * 1024)
        self.objects = [{"n": i} for i in range(60_000)]

    def __call__(self) -> None:
        bytearray(self.block)
        for item in self.objects:
            item["n"]


def job_costs(requests: int) -> None:
    flush = CacheFlusher()
    print(f"The guard's job per warm request with a new turn, in one process (median of 5 runs of {requests}):")
    print(f"  {'conversation':44s} {'caches warm':>12s} {'caches emptied':>15s}")
    for label, repeat in (("96 messages (make bench's)", 1), ("24 messages, turns 4x longer", 4)):
        bodies = Bodies.of_size(88_000, longer=repeat)
        job = _job_runner(bodies)
        figures = []
        for emptied in (False, True):
            runs = []
            for _ in range(5):
                raws = [bodies.warm() for _ in range(requests)]
                spent = 0.0
                for raw in raws:
                    if emptied:
                        flush()
                    started_at = time.perf_counter()
                    job(raw)
                    spent += time.perf_counter() - started_at
                runs.append(spent / len(raws) * 1e6)
            figures.append(statistics.median(runs))
        size = len(bodies.warm()) // 1000
        print(f"  {label + f' ({size} KB)':44s} {figures[0]:9.0f} us {figures[1]:12.0f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--only", choices=("functions", "job"))
    parser.add_argument("--serve-counted", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_counted:
        serve_counted(args.serve_counted)
        return
    if args.only != "job":
        functions_per_request(args.requests)
    if args.only != "functions":
        job_costs(args.requests)


if __name__ == "__main__":
    main()
