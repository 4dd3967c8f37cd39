"""Parts of a request the guard cannot see, whatever the API shape: what they cost is neither
counted nor bounded, so what the upstream says about such a request (its overflow error's count,
its usage) is about that request and must not be learned for the model.

A part is unseen when the provider reads content the body does not carry and the count gives it
no upper bound: a file sent by `file_id` or URL (counted as 0), audio without its data, a document
an Anthropic request names by file id or URL. An image by URL is not unseen: it is priced at the
most an image can cost. The walk looks only at list contents (a string content has no parts), so
it costs a step per part; and it is taken only when the body's bytes may hold such a part
(`may_hold_unseen`), so a conversation sent again costs a few byte searches, not a walk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Most parts named, for the log: a request with thousands says so with the first few.
NAMED_AT_MOST = 8


# The type values an unseen part must carry, as they stand in the body's bytes. A value written with
# a `\u` escape may spell one of them: a body with any escape is walked.
_MARKERS = (b'"file"', b'"input_audio"', b'"document"', b"\\u")


def may_hold_unseen(raw: bytes) -> bool:
    """False when the body's bytes cannot hold an unseen part (no type value that names one)."""
    return any(marker in raw for marker in _MARKERS)


def unseen_parts(messages: Sequence[Any]) -> tuple[str, ...]:
    """Where the parts of the chat view's `messages` that the guard cannot see are
    (`messages[3].content[1]: file by id`), at most `NAMED_AT_MOST` of them."""
    found: list[str] = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            why = _unseen(part)
            if why is not None:
                found.append(f"messages[{i}].content[{j}]: {why}")
                if len(found) >= NAMED_AT_MOST:
                    return tuple(found)
    return tuple(found)


def _unseen(part: object) -> str | None:
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    if kind == "text" or kind == "image_url":
        return None
    if kind == "file":
        spec = part.get("file")
        return None if isinstance(spec, Mapping) and isinstance(spec.get("file_data"), str) else "file by id or URL"
    if kind == "input_audio":
        spec = part.get("input_audio")
        return None if isinstance(spec, Mapping) and isinstance(spec.get("data"), str) else "audio without its data"
    if kind == "item":  # an adapter's opaque part, counted as its JSON
        item = part.get("item")
        if isinstance(item, Mapping) and item.get("type") == "document":  # Anthropic's, by reference
            source = item.get("source")
            if isinstance(source, Mapping) and source.get("type") in ("file", "url"):
                return "document by file id or URL"
    return None
