"""The echo's tests run it behind the guard, started as the shell's own tests start it."""

from tests.server.conftest import logs, start_proxy  # noqa: F401  (fixtures, shared with tests/server/)
