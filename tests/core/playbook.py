"""A Playbook drives the core's exchange with no sockets, as mitmproxy's tests drive a layer:
`<< expected` is the command the exchange must yield next, `>> reply` what the server answers it.

    assert Playbook(exchange) << PlanFor(None) >> plan << Send(None, plan, 1, "unchanged") >> Delivered() << None

An expected command is matched by equality, by type (`<< Summarise`), or by a predicate
(`<< (lambda c: ...)`); `<< None` says the exchange is over.
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable
from typing import Any

from proxy.core.exchange import Command, Exchange, Reply

_START = object()


class Playbook:
    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange
        self.script: list[tuple[str, Any]] = []
        self.commands: list[Command | None] = []  # what the exchange yielded, in order

    def __lshift__(self, expected: Any) -> Playbook:
        self.script.append(("yields", expected))
        return self

    def __rshift__(self, reply: Reply) -> Playbook:
        self.script.append(("reply", reply))
        return self

    def __bool__(self) -> bool:
        command: Any = _START
        for step, (kind, value) in enumerate(self.script):
            if kind == "reply":
                assert command is not _START, "a playbook starts with the command the exchange yields first"
                command = self.exchange.send(value)
                self.commands.append(command)
                continue
            if command is _START:
                command = self.exchange.start()
                self.commands.append(command)
            if not _matches(command, value):
                raise AssertionError(f"step {step}: expected {_short(value)}, the exchange yielded {_short(command)}")
        return True


def _matches(command: Command | None, expected: Any) -> bool:
    if expected is None or command is None:
        return expected is command
    if isinstance(expected, type):
        return isinstance(command, expected)
    if isinstance(expected, Callable) and not hasattr(expected, "__dataclass_fields__"):  # type: ignore[arg-type]
        return bool(expected(command))
    return bool(command == expected)


def _short(value: object) -> str:
    short = reprlib.Repr()  # Python 3.11's takes no keywords
    short.maxstring, short.maxother, short.maxlevel = 60, 200, 3
    return short.repr(value)
