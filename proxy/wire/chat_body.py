"""A chat-completions body read from its bytes: strict JSON (`proxy.wire.strict_json`), then the
chat adapter's type checks (`proxy.apis.openai.chat_checks`), in one call for the echo upstream and tools."""

from __future__ import annotations

from typing import Any

from proxy.apis.openai.chat_checks import check_chat_body
from proxy.wire.strict_json import DEFAULT_LIMITS, JsonLimits, read_json


def read_chat_body(raw: bytes, limits: JsonLimits = DEFAULT_LIMITS, *, require_model: bool = True) -> dict[str, Any]:
    """The body of a chat-completions request, checked; UnreadableJson (not JSON, or ambiguous) or
    InvalidBody (a field of the wrong type) saying what is wrong (`proxy.server.edge.body` maps both)."""
    return check_chat_body(read_json(raw, limits), require_model=require_model)
