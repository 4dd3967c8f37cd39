"""A bad request body, whichever layer found it, becomes one OpenAI-shaped 400 here and nowhere else.

The layers below the server raise their own types and know nothing of HTTP (httpx's
`map_httpcore_exceptions()` is the model: foreign errors are translated in one context manager):

    UnreadableJson   proxy.wire.strict_json   not JSON, or ambiguous (`key`: a key written twice)
    InvalidBody      proxy.core.plan          not a chat-completions body (`param`: the field)
    └── InvalidRequest  proxy.apis.base       not a body this API accepts (`param`, in its spelling)

`bad_body_errors()` wraps every place the server reads or parses a body and turns each into
`BadRequest` (400, `invalid_request_error`) with the message and the field it names; the error
middleware then renders it in the API's own shape.
"""

from __future__ import annotations

from types import TracebackType

from proxy.core.plan import InvalidBody
from proxy.errors import BadRequest
from proxy.wire.strict_json import UnreadableJson

BODY_ERRORS = (UnreadableJson, InvalidBody)  # InvalidRequest is an InvalidBody


def bad_request(error: UnreadableJson | InvalidBody) -> BadRequest:
    """The 400 for a body error: its message, and the field it names as `param`."""
    param = error.key if isinstance(error, UnreadableJson) else error.param
    return BadRequest(str(error), param=param)


class _BadBodyErrors:
    """The context manager `bad_body_errors()` returns: stateless, so one serves every request
    (a class, not `@contextmanager`: no generator made per request on the parse path)."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if isinstance(error, BODY_ERRORS):
            raise bad_request(error) from None


_MAPPING = _BadBodyErrors()


def bad_body_errors() -> _BadBodyErrors:
    """Inside, a body error of any layer is raised as its `BadRequest`; other errors pass untouched."""
    return _MAPPING
