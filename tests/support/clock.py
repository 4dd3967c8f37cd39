"""A clock a test moves by hand, for code that takes a `clock` (a callable returning seconds):
time passes only when the test says so, so nothing depends on how busy the machine is."""

from __future__ import annotations


class ManualClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
