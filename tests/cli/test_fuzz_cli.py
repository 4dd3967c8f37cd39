"""The CLI's `count` and `trim` answer any body with exit 0, 2 or 3, and a one-line message for 2."""

from __future__ import annotations

import contextlib
import io
import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.cli import EXIT_BAD_INPUT, EXIT_OK, EXIT_REJECTED, main
from tests.support.fuzz_bodies import fuzzed_bodies

COMMANDS = [["count", "-"], ["trim", "-"], ["trim", "--context-window", "600", "-"]]


class _Stdin:
    def __init__(self, data: bytes) -> None:
        self.buffer = io.BytesIO(data)


def run_cli(argv: list[str], data: bytes) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    saved, sys.stdin = sys.stdin, _Stdin(data)  # type: ignore[assignment]  # the CLI reads stdin.buffer only
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    finally:
        sys.stdin = saved
    return code, out.getvalue(), err.getvalue()


class TestFuzzedCli:
    @settings(max_examples=120, deadline=None)
    @given(body=fuzzed_bodies(), argv=st.sampled_from(COMMANDS))
    def test_exit_codes_are_0_2_or_3_only(self, body: bytes, argv: list[str]):
        code, out, err = run_cli(argv, body)
        assert code in (EXIT_OK, EXIT_BAD_INPUT, EXIT_REJECTED)
        if code == EXIT_BAD_INPUT:
            assert out == "" and err.startswith("context-guard: ") and err.count("\n") == 1
        elif code == EXIT_REJECTED:  # the report on stdout, and why in one line on stderr
            assert isinstance(json.loads(out), dict) and err.startswith("context-guard: rejected: ")
            assert err.count("\n") == 1
        else:
            assert isinstance(json.loads(out), dict) and err == ""

    @pytest.mark.parametrize(
        ("body", "fragment"),
        [
            (
                b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "tools": 5}',
                "tools must be an array",
            ),
            (
                b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "tool_choice": {"function": 5}}',
                "tool_choice.function must be an object",
            ),
            (
                b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000000000000000000000}',
                "max_tokens must be a whole number",
            ),
            (b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "\\ud800"}]}', "lone UTF-16 surrogate"),
            (
                b'{"model": "gpt-4o", "messages": [], "messages": [{"role": "user", "content": "hi"}]}',
                "'messages' twice",
            ),
            (
                b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "x": '
                + b"[" * 100
                + b"]" * 100
                + b"}",
                "deeper",
            ),
        ],
    )
    def test_the_issue_s_bodies_exit_2_with_one_line(self, body: bytes, fragment: str):
        code, out, err = run_cli(["trim", "-"], body)
        assert (
            code == EXIT_BAD_INPUT and out == "" and fragment in err and err.count("\n") == 1 and "Traceback" not in err
        )
