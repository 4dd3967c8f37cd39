"""What the guard changes in a streamed request's body before sending it upstream.

- `ask_for_usage()` adds `stream_options.include_usage` to a stream that did not ask for its
  usage, so the upstream's count can calibrate the guard's (the usage chunk is then taken out of
  what the client sees: `proxy.server.upstream.usage.UsageTap`);
- `overflow_probe()` is what is sent instead when a stream came back empty from a server that
  answers an over-window stream that way, to learn why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def ask_for_usage(body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """`body` with `stream_options.include_usage` set when it streams and did not ask for usage;
    and whether it was added (so the usage chunk is stripped from what the client sees)."""
    if body.get("stream") is not True:
        return dict(body), False
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return dict(body), False  # malformed: the upstream answers it, as the client sent it
    if options and "include_usage" in options:
        return dict(body), False
    return {**body, "stream_options": {**(options or {}), "include_usage": True}}, True


def overflow_probe(body: Mapping[str, Any]) -> dict[str, Any]:
    """What to send when a stream came back empty from a server that answers an over-window
    stream that way (llama-cpp-python): the same prompt, not streamed, for one token. An
    overflow is refused before any generation, and this time the error says the window and
    the server's count, so the guard can self-correct as for any other overflow."""
    probe = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "max_completion_tokens")}
    return {**probe, "max_tokens": 1}
