"""The `context-guard` command: `serve`, `count` and `trim`.

`count` and `trim` read one chat-completions body (a JSON file, or `-` for standard input) and
print a JSON report. Exit status: 0 when the request fits (or, for `trim`, was cut to fit);
3 when `trim`'s overflow policy rejected it; 2 for bad input or configuration, with a one-line
message on standard error.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TextIO

from proxy.chat_body import read_chat_body
from proxy.core.models import ModelOverride
from proxy.core.plan import InvalidBody
from proxy.errors import ConfigError
from proxy.settings import ModelSettings, Settings, load_settings

EXIT_OK, EXIT_BAD_INPUT, EXIT_REJECTED = 0, 2, 3


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except (ConfigError, InvalidBody, _InputError) as exc:
        print(f"context-guard: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


class _InputError(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="context-guard", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", help="YAML settings file (default: built-in defaults)")
    serve.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to listen on (default 8080)")
    serve.add_argument("--upstream", help="send every request to this base URL, e.g. http://localhost:8000/v1")
    serve.set_defaults(run=_serve)

    for name, run, help_text in (
        ("count", _count, "count a request body and report its budget"),
        ("trim", _trim, "fit a request body to its budget and print the result"),
    ):
        sub = commands.add_parser(name, help=help_text)
        sub.add_argument("file", nargs="?", default="-", help="request body as JSON, or - for standard input")
        sub.add_argument("--model", help="model to count for (default: the body's `model`)")
        sub.add_argument("--config", help="YAML settings file")
        sub.add_argument("--context-window", type=int, help="override the model's context window")
        sub.set_defaults(run=run)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from proxy.server.run import serve

    settings = load_settings(args.config)
    if args.upstream:
        try:
            settings = settings.with_upstream_url(args.upstream)
        except ValueError as exc:
            raise ConfigError(str(exc), key="--upstream") from None
    if args.host:
        settings = replace(settings, host=args.host)
    if args.port is not None:
        settings = replace(settings, port=args.port)
    serve(settings)
    return EXIT_OK


def _load(args: argparse.Namespace) -> tuple[Any, dict[str, Any], str]:
    from proxy.guard import Guard

    settings: Settings = load_settings(args.config)
    body = _read_body(args.file, sys.stdin)
    model = args.model or body.get("model")
    if not isinstance(model, str) or not model:
        raise _InputError("no model: pass --model or put `model` in the body")
    if args.context_window is not None:
        if args.context_window < 1:
            raise _InputError("--context-window must be a positive number")
        pin = ModelSettings(ModelOverride(model, context_window=args.context_window))
        settings = replace(settings, models=(pin, *settings.models))
    return Guard(settings), dict(body), model


def _count(args: argparse.Namespace) -> int:
    guard, body, model = _load(args)
    plan = guard.plan(body, model)
    profile = guard.profile(model)
    budget = plan.result.budget
    report = {
        "model": model,
        "matched": profile.matched,
        "window_source": profile.window_source,
        **plan.count.to_dict(),
        **budget.to_dict(guard.settings.trim.budget),
        "prompt_tokens": plan.count.total,
    }
    _print(report)
    return EXIT_OK


def _trim(args: argparse.Namespace) -> int:
    guard, body, model = _load(args)
    plan = guard.plan(body, model)
    result = plan.result
    report = result.report(guard.settings.trim.budget)
    if result.outcome == "rejected":
        report["error"] = result.rejection_message()
    _print({"body": result.body, "report": report})
    return EXIT_REJECTED if result.outcome == "rejected" else EXIT_OK


def _read_body(name: str, stdin: TextIO) -> dict[str, Any]:
    """The chat body in file `name` (or standard input), checked as the proxy checks it."""
    try:
        data = stdin.buffer.read() if name == "-" else open(name, "rb").read()  # noqa: SIM115  # read whole, once
    except OSError as exc:
        raise _InputError(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        return read_chat_body(data, require_model=False)
    except InvalidBody as exc:
        raise _InputError(f"{'standard input' if name == '-' else name}: {exc}") from None


def _print(value: object) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
