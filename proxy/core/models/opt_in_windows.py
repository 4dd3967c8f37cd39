"""Windows a request opts into: the provider serves some models with a larger window when the
request asks for it, so the window to budget is the one this request will be served with.

Anthropic serves Claude Sonnet 4 and Sonnet 4.5 with 200,000 tokens, and with 1,000,000 when the
request carries the beta header `anthropic-beta: context-1m-2025-08-07` (a comma-separated list
of betas). The models whose 1M window is their default (Sonnet 4.6, Opus 4.6 and later) have it
in the model map already and need no entry. A request that opts in is budgeted with the larger
window; one that does not keeps the model's own.

Anthropic announced the beta's end on its own API for these two models (2026-04-30); a provider
that then refuses such a request says so in its overflow error, and the guard's self-correction
(`proxy.core.learning.corrections`) learns the smaller window from it and keeps it.

Only a window that came from the model map is raised: an operator's override and the window a
server states win over a header. And only where the provider honours the header: the providers
that list it (`proxy.providers`: Anthropic's) and the API shapes it names (Messages). The same
header sent to an OpenAI-compatible server, a Gemini or a Vertex AI upstream asks nothing of it,
so the model keeps its own window there.

A correction learned on a request that opted in is about the window served to such requests: it
is kept apart (`correction_key`), and applies neither to the model's requests that did not opt in
nor the other way round.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.core.record_fields import field_dict


@dataclass(frozen=True, slots=True)
class OptIn:
    header: str  # the request header that asks for it (lower case)
    token: str  # the value among the header's comma-separated ones
    models: tuple[str, ...]  # patterns on the lower-cased model name, without a `provider/` prefix
    context_window: int
    source: str  # the provider's page that documents it
    checked: str  # the date it was read (YYYY-MM-DD)
    apis: tuple[str, ...] = ("messages",)  # the API shapes it is honoured on

    def to_dict(self) -> dict[str, object]:
        return field_dict(self)


_CONTEXT_WINDOWS = "https://platform.claude.com/docs/en/build-with-claude/context-windows"

OPT_INS: tuple[OptIn, ...] = (
    OptIn(
        "anthropic-beta",
        "context-1m-2025-08-07",
        ("claude-sonnet-4-5", "claude-sonnet-4-5-*", "claude-sonnet-4", "claude-sonnet-4-0", "claude-sonnet-4-2025*"),
        1_000_000,
        _CONTEXT_WINDOWS,
        "2026-11-28",
    ),
)


def opted_in(model: str, headers: Mapping[str, str], opt_ins: tuple[OptIn, ...], api: str) -> OptIn | None:
    """The larger window `headers` ask `model` to be served with on API shape `api`, among
    `opt_ins` (those the upstream's provider honours, `Provider.opt_ins`), or None (`headers`: a
    mapping whose `get` takes a header's name in lower case, as aiohttp's does)."""
    for opt_in in opt_ins:
        value = headers.get(opt_in.header)  # most requests carry none: nothing more is done for them
        if not value or opt_in.token not in (v.strip() for v in value.split(",")):
            continue
        if api not in opt_in.apis:
            continue
        name = model.lower().rsplit("/", 1)[-1]
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in opt_in.models):
            return opt_in
    return None


def correction_key(model: str, opt_in: OptIn | None) -> str:
    """The name a correction for `model` is kept under: the model's, or for a request that opted
    into a larger window, the model's with the opt-in's token (a name no model has: `+` and the
    token's date)."""
    return model if opt_in is None else f"{model}+{opt_in.token}"
