"""A bad request body, whichever layer found it, becomes one OpenAI-shaped 400 here and nowhere else.

The layers below the server raise one type, `proxy.core.body_error.BodyError` (its docstring draws
the tree), and know nothing of HTTP (httpx's `map_httpcore_exceptions()` is the model: foreign
errors are translated in one context manager).

`bad_body_errors()` wraps every place the server (and the CLI) reads or parses a body and turns a
`BodyError` into `BadRequest` (400, `invalid_request_error`) with the message and the field it
names; the error middleware then renders it in the API's own shape, the CLI prints it as one line.
"""

from __future__ import annotations

from types import TracebackType

from proxy.core.body_error import BodyError
from proxy.errors import BadRequest


def bad_request(error: BodyError) -> BadRequest:
    """The 400 for a body error: its message, and the field it names as `param`."""
    return BadRequest(str(error), param=error.param)


class _BadBodyErrors:
    """The context manager `bad_body_errors()` returns: stateless, so one serves every request
    (a class, not `@contextmanager`: no generator made per request on the parse path)."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if isinstance(error, BodyError):
            raise bad_request(error) from None


_MAPPING = _BadBodyErrors()


def bad_body_errors() -> _BadBodyErrors:
    """Inside, a body error of any layer is raised as its `BadRequest`; other errors pass untouched."""
    return _MAPPING
