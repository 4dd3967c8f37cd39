"""How many of the guard's modules one warm request runs functions in, traced in the real `serve` process.

A reader follows a request by opening the modules it runs through; this counts them. The guard is
started as `context-guard serve --workers 1` would start it, in a child process that installs a
profile hook on every thread before it serves (`--serve`): while recording, the hook notes the
module of every Python function called. The parent starts the echo upstream in its own process
(so none of its modules count), warms each scenario up with a few requests, then records exactly
one request: SIGUSR1 starts the recording, SIGUSR2 stops it and writes the modules to a file.

What counts as the request's: every call on a thread of the guard's pools, and every call on the
event loop's thread in the request's own context (marked when the `records` middleware takes the
request; the tasks and callbacks it schedules inherit it). A timer the process set before the
request (the loop-lag tick) that fires during the recording runs outside that context: its
modules, when the request itself did not enter them, are printed apart on their own line, never
dropped from view. A callback a pool's thread schedules back onto the loop also runs outside the
context; its module (`proxy.server.threads.placement`) is the request's through its other calls.

Scenarios, each a conversation that grows by one turn a request unless it says otherwise:

    chat, same body      a fitting chat request re-sent as it was (the prefix reader's fast path)
    chat, new turn       a fitting chat request one turn longer than the last
    chat, trimmed        over a 4,096-token window: trimmed, then forwarded
    messages, new turn   Anthropic Messages, fitting
    gemini, new turn     Gemini generateContent, fitting

    python bench/modules_per_request.py [--list]
"""

from __future__ import annotations

import argparse
import contextvars
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.processes import free_port, python, stop, wait_ready  # noqa: E402

WARMUP = 6
CONFIG = """\
log: {{format: json, level: warning}}
readiness: {{require_upstreams: false}}
upstreams:
  echo: {{kind: echo, base_url: "{url}"}}
routes:
  - {{match: "*", upstream: echo}}
models:
  overrides:
    - {{match: small-window-model, context_window: 4096, alias_of: gpt-4o}}
"""


def serve_traced(config: str, port: int, folder: Path) -> int:
    """The child: `serve` with a profile hook on every thread, recording between the signals.

    A request is done when the `records` middleware's last step, `Drain.finished`, runs, which is
    after its client has the answer: a signal that comes while a request is in flight takes
    effect when the last one in flight finishes, so the recording holds exactly the one request
    (not the end of the warm-up request before it, nor less than its own end)."""
    recording = threading.Event()
    seen: set[str] = set()  # the request's modules
    outside: set[str] = set()  # modules run on the loop's thread outside the request's context
    loop_thread = {"id": -1}  # the event loop's thread: the one the `records` middleware runs on
    in_request: contextvars.ContextVar[bool] = contextvars.ContextVar("in_request", default=False)
    flight = {"in": 0, "start": False, "stop": False}

    def start() -> None:
        flight["start"] = False
        seen.clear()
        outside.clear()
        recording.set()
        (folder / "recording").touch()

    def finish() -> None:
        flight["stop"] = False
        recording.clear()
        modules = {"request": sorted(seen), "outside": sorted(outside - seen)}
        (folder / "modules.json").write_text(json.dumps(modules))

    def hook(frame: FrameType, event: str, _: Any) -> None:
        if event != "call":
            return
        name = frame.f_globals.get("__name__", "")
        if not name.startswith("proxy"):
            return
        if name == "proxy.server.process.app" and frame.f_code.co_name == "records":
            in_request.set(True)  # in the request's task: what it schedules inherits the mark
            loop_thread["id"] = threading.get_ident()
        if recording.is_set():
            if in_request.get() or threading.get_ident() != loop_thread["id"]:
                seen.add(name)
            else:
                outside.add(name)
        if name == "proxy.server.process.app" and frame.f_code.co_qualname in ("Drain.started", "Drain.finished"):
            flight["in"] += 1 if frame.f_code.co_name == "started" else -1
            if flight["in"] == 0 and flight["stop"]:
                finish()
            elif flight["in"] == 0 and flight["start"]:
                start()

    def on_start(*_: Any) -> None:
        if flight["in"]:
            flight["start"] = True
        else:
            start()

    def on_stop(*_: Any) -> None:
        if flight["in"]:
            flight["stop"] = True
        else:
            finish()

    signal.signal(signal.SIGUSR1, on_start)
    signal.signal(signal.SIGUSR2, on_stop)
    threading.setprofile(hook)  # type: ignore[arg-type]  # threads the guard starts from now on
    sys.setprofile(hook)  # type: ignore[arg-type]
    from proxy.cli import main

    return main(["serve", "--config", config, "--port", str(port), "--workers", "1"])


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"content-type": "application/json", **headers})
    with urllib.request.urlopen(request, timeout=60) as answer:
        answer.read()
        return int(answer.status)


def _chat(turns: int, size: int = 60, model: str = "gpt-4o") -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for k in range(turns):
        messages += [
            {"role": "user", "content": f"Question {k}: " + "word " * size},
            {"role": "assistant", "content": f"Answer {k}: " + "reply " * size},
        ]
    return {"model": model, "messages": [*messages, {"role": "user", "content": "And now?"}], "max_tokens": 256}


def _messages(turns: int) -> dict[str, Any]:
    chat = _chat(turns, model="claude-sonnet-4-5")
    return {"model": chat["model"], "system": "You are terse.", "messages": chat["messages"][1:], "max_tokens": 256}


def _gemini(turns: int) -> dict[str, Any]:
    role = {"user": "user", "assistant": "model"}
    contents = [{"role": role[m["role"]], "parts": [{"text": m["content"]}]} for m in _chat(turns)["messages"][1:]]
    return {"systemInstruction": {"parts": [{"text": "You are terse."}]}, "contents": contents}


# name -> (path, body of the n-th request, whether the body grows with n)
SCENARIOS: dict[str, tuple[str, Callable[[int], dict[str, Any]]]] = {
    "chat, same body": ("/v1/chat/completions", lambda n: _chat(20)),
    "chat, new turn": ("/v1/chat/completions", lambda n: _chat(20 + n)),
    "chat, trimmed": ("/v1/chat/completions", lambda n: _chat(40 + n, model="small-window-model")),
    "messages, new turn": ("/v1/messages", lambda n: _messages(20 + n)),
    "gemini, new turn": ("/v1beta/models/gemini-2.5-flash:generateContent", lambda n: _gemini(20 + n)),
}


def _wait_for(path: Path, deadline: float = 10.0) -> None:
    until = time.monotonic() + deadline
    while not path.exists():
        if time.monotonic() > until:
            raise RuntimeError(f"the traced guard did not write {path.name}")
        time.sleep(0.01)


def measure() -> Iterator[tuple[str, dict[str, list[str]]]]:
    from proxy.demo.echo import echo_in_thread

    with echo_in_thread() as echo_url, tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = folder / "guard.yaml"
        config.write_text(CONFIG.format(url=echo_url))
        port = free_port()
        command = [*python(), __file__, "--serve", str(config), str(port), str(folder)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        child = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_ready(port, child, path="/livez")
            base = f"http://127.0.0.1:{port}"
            headers = {"authorization": "Bearer sk-test", "x-api-key": "sk-test", "x-goog-api-key": "k"}
            for name, (path, body) in SCENARIOS.items():
                for n in range(WARMUP):
                    _post(base + path, body(n), headers)
                for marker in ("recording", "modules.json"):
                    (folder / marker).unlink(missing_ok=True)
                child.send_signal(signal.SIGUSR1)
                _wait_for(folder / "recording")
                _post(base + path, body(WARMUP), headers)
                child.send_signal(signal.SIGUSR2)
                _wait_for(folder / "modules.json")
                yield name, json.loads((folder / "modules.json").read_text())
        finally:
            stop(child)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="name the modules of each scenario")
    parser.add_argument("--serve", nargs=3, metavar=("CONFIG", "PORT", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        config, port, folder = args.serve
        sys.exit(serve_traced(config, int(port), Path(folder)))
    print("| request | modules of the guard run | run outside the request meanwhile (not counted) |")
    print("| --- | --- | --- |")
    listed = []
    for name, modules in measure():
        print(f"| {name} | {len(modules['request'])} | {', '.join(modules['outside']) or '-'} |", flush=True)
        listed.append((name, modules["request"]))
    if args.list:
        for name, request in listed:
            print(f"\n{name}:\n  " + "\n  ".join(request))


if __name__ == "__main__":
    main()
