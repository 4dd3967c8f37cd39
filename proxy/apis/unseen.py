"""Parts of a request the guard cannot see, whatever the API shape: what they cost is neither
counted nor bounded, so what the upstream says about such a request (its overflow error's count,
its usage) is about that request and must not be learned for the model.

A part is unseen when the provider reads content the body does not carry and the count gives it
no upper bound: a file sent by `file_id` or URL (counted as 0), audio without its data, a document
an Anthropic request names by file id or URL. An image by URL is not unseen: it is priced at the
most an image can cost. The walk looks only at list contents (a string content has no parts), so
it costs a step per message and per part: 13 us for a re-sent 88 KB conversation of 96 messages.
(Searching the body's bytes for the type values first cost 275 us on that body: JSON is dense in
the quotes and backslashes such a search stops at.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Most parts named, for the log: a request with thousands says so with the first few.
NAMED_AT_MOST = 8


def unseen_parts(messages: Sequence[Any], start: int = 0) -> tuple[str, ...]:
    """Where the parts of the chat view's `messages` that the guard cannot see are
    (`messages[3].content[1]: file by id`), at most `NAMED_AT_MOST` of them; the messages before
    `start` are known to hold none."""
    found: list[str] = []
    for i in range(start, len(messages)):
        message = messages[i]
        # The view's messages are dicts: the concrete type is checked before the ABC (a tenth of the cost).
        content = message.get("content") if type(message) is dict or isinstance(message, Mapping) else None
        if type(content) is not list:
            continue
        for j, part in enumerate(content):
            if type(part) is dict and part.get("type") in _SEEN:
                continue
            why = _unseen(part)
            if why is not None:
                found.append(f"messages[{i}].content[{j}]: {why}")
                if len(found) >= NAMED_AT_MOST:
                    return tuple(found)
    return tuple(found)


# Part types that are always read whole: a text, an image priced at the most an image can cost.
_SEEN = frozenset({"text", "image_url"})


def _unseen(part: object) -> str | None:
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    if kind in _SEEN:
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
