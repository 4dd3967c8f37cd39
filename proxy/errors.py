"""One exception tree for context-guard; each error knows its HTTP status and OpenAI error shape.

    ConfigError                       bad settings or missing local files: fails at start
    GuardError                        anything a client is answered with
    ├── BadRequest              400   invalid JSON, a body that is not an object, no `messages`
    ├── ContextLengthExceeded   400   nothing more may be cut and the policy is `reject`
    ├── HTTPRefusal             4xx   a status of its own: 404 path not served, 405 method, 408 ...
    ├── Unauthorized            401   a client key was required and not given
    ├── ModelNotRouted          404   no upstream serves this model
    ├── PathNotFound            404   a path neither counted, answered here, nor allowed through
    ├── MethodNotAllowed        405   e.g. GET on a chat path
    ├── RequestTimeout          408   the client did not send its body in time
    ├── PayloadTooLarge         413   body over `server.max_body_bytes` (before or after inflating)
    ├── UnsupportedEncoding     415   a request `Content-Encoding` the proxy cannot inflate
    ├── TooManyRequests         429   one client's request bodies would hold more than its share of memory
    ├── ClientDisconnected      499   the client went away (logged, never sent)
    ├── UpstreamUnavailable     502   refused, reset or unreachable upstream
    ├── Overloaded              503   every upstream connection stayed busy, or request bodies fill the memory budget
    └── UpstreamTimeout         504   upstream did not answer in time

`GuardError.to_openai()` renders `{"error": {"message", "type", "param", "code"}}`, the shape
OpenAI's SDKs parse; the server's one error middleware is the only place that does so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from proxy.core.trimming.budget import TrimResult


class ConfigError(Exception):
    """A setting or a local file the proxy needs is wrong; `source` and `key` say where."""

    def __init__(self, message: str, *, source: str | None = None, key: str | None = None) -> None:
        self.source = source
        self.key = key
        where = ": ".join(part for part in (source, key) if part)
        super().__init__(f"{where}: {message}" if where else message)


class GuardError(Exception):
    status: int = 500
    error_type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}  # added to the error response (e.g. the guard's token report)

    def to_openai(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}

    @property
    def named_message(self) -> str:
        """The message with the field it names in front, for shapes whose errors have no field for
        it (Google's, Bedrock's); as it is when it names the field already."""
        param, message = self.param, self.message
        return f"{param}: {message}" if param and not message.startswith(param) else message


class BadRequest(GuardError):
    status = 400
    error_type = "invalid_request_error"
    code = "invalid_request"


class HTTPRefusal(GuardError):
    """A refusal with a status of its own (405 for a wrong method, 404 for a path not served, ...)."""

    error_type = "invalid_request_error"

    def __init__(self, message: str, status: int, *, code: str | None = None, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.status, self.code = status, code


class ContextLengthExceeded(GuardError):
    status = 400
    error_type = "invalid_request_error"
    code = "context_length_exceeded"

    @classmethod
    def refused(cls, result: TrimResult, wording: OverflowWording, headers: dict[str, str]) -> ContextLengthExceeded:
        """The guard's refusal of `result`, worded as the provider of the request's API shape words
        its own overflow (`wording`: the shape's adapter, so client libraries classify it as one),
        with the guard's budget in the headers too."""
        budget = result.budget
        report = {
            **headers,
            "x-context-guard-context-window": str(budget.context_window),
            "x-context-guard-output-reserve": str(budget.output_reserve),
            "x-context-guard-safety-margin": str(budget.safety_margin),
        }
        message, param = wording.overflow_refusal(result)
        return cls(message, param=param, headers=report)


class OverflowWording(Protocol):
    """Who words a refusal for overflow: an API shape's adapter (`proxy.apis.base.Adapter`)."""

    def overflow_refusal(self, result: TrimResult) -> tuple[str, str | None]:
        """The message, and the parameter it names (None where the shape's errors name none)."""
        ...


class Unauthorized(GuardError):
    status = 401
    error_type = "invalid_request_error"
    code = "invalid_api_key"


class ModelNotRouted(GuardError):
    status = 404
    error_type = "invalid_request_error"
    code = "model_not_found"


class PathNotFound(GuardError):
    status = 404
    error_type = "invalid_request_error"
    code = "unknown_url"


class MethodNotAllowed(GuardError):
    status = 405
    error_type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTimeout(GuardError):
    status = 408
    error_type = "invalid_request_error"
    code = "request_timeout"


class PayloadTooLarge(GuardError):
    status = 413
    error_type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedEncoding(GuardError):
    status = 415
    error_type = "invalid_request_error"
    code = "unsupported_content_encoding"


class TooManyRequests(GuardError):
    status = 429
    error_type = "requests"  # OpenAI's type and code for a rate limit: its SDKs retry after `Retry-After`
    code = "rate_limit_exceeded"


class ClientDisconnected(GuardError):
    """Not an answer (nobody is left to read it): the status and code the log line records."""

    status = 499
    error_type = "client_error"
    code = "client_disconnected"


class UpstreamUnavailable(GuardError):
    status = 502
    error_type = "upstream_error"
    code = "upstream_unavailable"


class Overloaded(GuardError):
    status = 503
    error_type = "server_error"
    code = "overloaded"


class UpstreamTimeout(GuardError):
    status = 504
    error_type = "upstream_error"
    code = "upstream_timeout"
