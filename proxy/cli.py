"""The `context-guard` command: `serve`, `count`, `trim`, `check-config` and `demo`.

`count` and `trim` read one request body (a JSON file, or `-` for standard input; a bare list of
messages is read as `{"messages": [...]}`) and print a JSON report. `check-config` validates a
settings file and prints the effective settings with secrets masked.

Exit status: 0 when the request fits (or, for `trim`, was cut to fit; for `check-config`, the file
is valid); 3 when `trim`'s overflow policy rejected it; 2 for bad input or configuration, with a
one-line message on standard error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TextIO

from proxy.codec import loads as parse_json
from proxy.core.plan import InvalidBody, validate_body
from proxy.config_errors import reason
from proxy.errors import ConfigError
from proxy.settings import Settings, load_settings, masked

EXIT_OK, EXIT_BAD_INPUT, EXIT_REJECTED = 0, 2, 3
KNOWN_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_EXIT_CODES = "exit status: 0 fits (or was cut to fit), 3 rejected by the overflow policy, 2 bad input or config"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (ConfigError, InvalidBody, InputError) as exc:
        print(f"context-guard: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


class InputError(Exception):
    """A request file the CLI cannot use; the message is the one line the user sees."""


def package_version() -> str:
    try:
        return version("context-guard")
    except PackageNotFoundError:
        return "unknown"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="context-guard", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"context-guard {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="YAML settings file (default: built-in defaults)")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1, or $HOST)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8080, or $PORT)")
    serve.add_argument(
        "--upstream",
        help="send every request to this base URL, e.g. http://localhost:8000/v1; "
        "`echo` starts the built-in echo upstream (a testing aid that calls no model)",
    )
    serve.add_argument("--workers", type=int, help="serving processes on the port (default: the cores available)")
    serve.add_argument("--drain-delay", type=float, help="seconds new connections are still served after SIGTERM")
    serve.add_argument("--shutdown-grace", type=float, help="seconds in-flight requests get to finish after that")
    serve.set_defaults(run=_serve)

    check = commands.add_parser(
        "check-config", help="validate a settings file and print the effective settings (secrets masked)"
    )
    check.add_argument("file", help="YAML settings file")
    check.set_defaults(run=_check_config)

    demo = commands.add_parser("demo", help="show a real trim: the guard in front of a local echo upstream")
    demo.set_defaults(run=_demo)

    for name, run, help_text in (
        ("count", _count, "count a request body as given and report its budget"),
        ("trim", _trim, "fit a request body to its budget and print the result"),
    ):
        sub = commands.add_parser(name, help=help_text, description=f"{help_text}. {_EXIT_CODES}.")
        sub.add_argument("file", nargs="?", default="-", help="request body as JSON, or - for standard input")
        sub.add_argument("--model", help="model to count for (default: the body's `model`)")
        sub.add_argument("--config", help="YAML settings file")
        sub.add_argument("--context-window", type=int, help="override the model's context window")
        sub.set_defaults(run=run)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from proxy.server.run import SettingsSource, serve

    return serve(
        SettingsSource(args.config, args.upstream, args.host, args.port),
        workers=args.workers,
        drain_delay_seconds=args.drain_delay,
        shutdown_grace_seconds=args.shutdown_grace,
    )


def _check_config(args: argparse.Namespace) -> int:
    settings = load_settings(args.file)
    from proxy.guard import Guard

    Guard(settings)  # the files it names (model map, encodings, tokenizers) must load too
    _print({"config": settings.source, "valid": True, "settings": masked(settings)})
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    from proxy.demo import run_demo

    return run_demo(sys.stdout)


def _load(args: argparse.Namespace) -> tuple[Any, dict[str, Any], str, list[str]]:
    from proxy.guard import Guard

    settings: Settings = load_settings(args.config)
    notes: list[str] = []
    data = _read_json(args.file, sys.stdin)
    if isinstance(data, list):
        data = {"messages": data}
        notes.append('the file holds a list of messages; read as {"messages": [...]}')
    body = validate_body(data)
    model = args.model or body.get("model")
    if not isinstance(model, str) or not model:
        raise InputError("no model: pass --model or put `model` in the body")
    roles = sorted({m.get("role") for m in body["messages"]} - KNOWN_ROLES)
    if roles:
        notes.append(f"unknown role(s) {', '.join(map(repr, roles))}: counted as given; the API may refuse them")
    if args.context_window is not None:
        if args.context_window < 256:
            raise InputError("--context-window must be at least 256")
        pinned = {"match": model, "context_window": args.context_window}
        overrides = [pinned, *(o.model_dump(exclude_none=True) for o in settings.models.overrides)]
        models = settings.models.model_validate({**settings.models.model_dump(), "overrides": overrides})
        settings = settings.model_copy(update={"models": models})
    return Guard(settings), dict(body), model, notes


def _count(args: argparse.Namespace) -> int:
    """The request as given: `fits` is false when it does not fit; `after_trim` says what trimming would do."""
    guard, body, model, notes = _load(args)
    plan = guard.plan(body, model)
    profile = guard.profile(model)
    result = plan.result
    before = result.budget
    policy = guard.policy.budget
    report: dict[str, Any] = {
        "model": model,
        "matched": profile.matched,
        "window_source": profile.window_source,
        **plan.count.to_dict(),
        "context_window": before.context_window,
        "output_reserve": before.output_reserve,
        "reserve_source": before.reserve_source,
        "safety_margin": before.safety_margin,
        "input_budget": before.input_budget,
        "fits": plan.count.total <= before.input_budget,
        "overflow": plan.count.total - before.input_budget,
        "after_trim": {
            "outcome": result.outcome,
            "tokens_after": result.tokens_after,
            "fits": result.fits,
            "removed": len(result.removals),
            "is_constrained": result.budget.is_constrained(policy),
        },
        "warnings": notes,
    }
    _print(report)
    return EXIT_OK


def _trim(args: argparse.Namespace) -> int:
    guard, body, model, notes = _load(args)
    result = guard.plan(body, model).result
    report = result.report(guard.policy.budget)
    report["warnings"] = notes
    if result.outcome == "rejected":
        report["error"] = result.rejection_message()
    _print({"body": result.body, "report": report})
    return EXIT_REJECTED if result.outcome == "rejected" else EXIT_OK


def _read_json(name: str, stdin: TextIO) -> object:
    try:
        data = stdin.buffer.read() if name == "-" else open(name, "rb").read()  # noqa: SIM115  # read whole, once
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        return parse_json(data)
    except ValueError as exc:
        raise InputError(f"{'standard input' if name == '-' else name} is not valid JSON: {exc}") from None


def _print(value: object) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
