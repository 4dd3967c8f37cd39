"""Anthropic's API: Messages, its key in `x-api-key`, its `anthropic-version`, its count endpoint,
the context edits it applies itself and the 1M window a beta header opts into.

The count endpoint: `POST /v1/messages/count_tokens`, the Messages body without `max_tokens` and
the sampling fields, answered `{"input_tokens": N}`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from proxy.core.counting.edge import CountCall
from proxy.core.models.model_registry import TokenizerSpec
from proxy.core.models.opt_in_windows import OPT_INS, OptIn
from proxy.providers.provider import Provider

CLAUDE_BOUND = TokenizerSpec("bound", "claude")
ANTHROPIC_VERSION = "2023-06-01"  # sent only when the client named none
# What the count endpoint reads of a request; the rest (max_tokens, sampling) it refuses or ignores.
_COUNTED_FIELDS = ("model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers")


class Anthropic(Provider):
    kind: ClassVar[str] = "anthropic"
    shapes: ClassVar[tuple[str, ...]] = ("messages",)
    backend_kind: ClassVar[str] = "openai"  # must prompt + max_tokens fit, usage in streams: as OpenAI
    key_header: ClassVar[str | None] = "x-api-key"
    default_headers: ClassVar[Mapping[str, str]] = {"anthropic-version": ANTHROPIC_VERSION}
    edits_context: ClassVar[bool] = True
    opt_ins: ClassVar[tuple[OptIn, ...]] = OPT_INS

    count_endpoint: ClassVar[bool] = True
    vocabularies_at_start: ClassVar[tuple[TokenizerSpec, ...]] = (CLAUDE_BOUND,)  # Claude: a bound over cl100k

    def count_call(self, base_url: str, model: str, api: str, body: Mapping[str, Any]) -> CountCall | None:
        if api != "messages":
            return None
        base = base_url.rstrip("/")
        root = base.removesuffix("/v1")
        picked = {k: body[k] for k in _COUNTED_FIELDS if k in body}
        url = f"{root}/v1/messages/count_tokens"
        return CountCall(url, {**picked, "model": model}, "input_tokens", self.default_headers)

    corrections_name: ClassVar[str | None] = "anthropic"  # though it is counted as an OpenAI-like backend
