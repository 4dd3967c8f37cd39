"""Which model names may be written into an upstream URL: the one check every URL builder asks.

Some upstreams name the model in the path (Vertex AI's `.../publishers/google/models/{model}:countTokens`,
Gemini's `/v1beta/models/{model}:generateContent`). A client chooses the model name, and a name
with `..`, `/`, `?`, `#`, `%`, `:` or whitespace written there unquoted reaches another path, method
or project on the operator's credential. A name that passes `url_model_name` is one path segment of
letters, digits and `.`, `_`, `-`, `@` (Vertex's `model@version`), starting and ending with a letter
or a digit, with no `..`, at most `MAX_CHARS` long; any other name is never written into a URL
(the caller skips the call, or uses the route's own configured model).

Pure: no I/O.
"""

from __future__ import annotations

import re

MAX_CHARS = 128
_SEGMENT = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._@-]{0,126}[A-Za-z0-9])?")


def url_model_name(name: str) -> str | None:
    """`name` when it is safe as one segment of a URL's path (see above), else None."""
    if _SEGMENT.fullmatch(name) is None or ".." in name:
        return None
    return name
