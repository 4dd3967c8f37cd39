"""The one type every layer raises for a request body it refuses, and the field it names.

    BodyError          proxy.core.body_error   a body the guard refuses; `param`: the field, if one is to blame
    ├── AmbiguousJson     proxy.wire.codec  JSON the guard will not guess about (`param`: a key written twice)
    ├── DenseJson         proxy.wire.codec  JSON whose values would take too much memory for its size
    ├── UnreadableJson    proxy.wire.codec  not JSON, ambiguous or too dense, worded for the client
    └── InvalidBody       proxy.core.plan         not a chat-completions body
        └── InvalidRequest  proxy.apis.base       not a body this API accepts (`param` in its spelling)

None of them knows HTTP: `proxy.server.edge.body` turns a `BodyError` into the 400 the server
answers and the message the CLI prints, in one place.
"""

from __future__ import annotations


class BodyError(ValueError):
    """A request body the guard refuses; the message is the client's, `param` names the field
    (or the duplicated key) to blame, when one is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
