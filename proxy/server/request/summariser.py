"""The summariser: asks a configured model, through an OpenAI-compatible chat endpoint, for the
summary of the messages a trim dropped (`summarize_dropped`), and remembers it by their hash.

A later request cut at the same place gets the remembered text (status `reused`), so the summary is
produced once per cut and the forwarded prefix stays the same. Concurrent requests for the same
span share one call. A summariser that answers late (past `deadline_seconds`), too much (over
`max_response_bytes`), or not at all leaves the request with its plain cut: the outcome's status
says `timeout`, `oversize` or `failed`, and nothing is raised. Nothing here logs: the caller
reports the status, never the text.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from proxy.config.settings import Settings
from proxy.core.trimming.budget import SummaryStatus
from proxy.core.trimming.compaction import SummaryRequest, summariser_messages

# Tokens of the summary message that are not the summary itself (the marker line and framing).
SUMMARY_OVERHEAD_TOKENS = 40


@dataclass(frozen=True)
class SummariserOptions:
    """`url`: the full chat-completions URL (e.g. http://127.0.0.1:8000/v1/chat/completions).
    `model`: the model that writes summaries. `headers`: sent with every call (authorization)."""

    url: str
    model: str
    headers: Mapping[str, str] = field(default_factory=dict)
    deadline_seconds: float = 10.0
    max_response_bytes: int = 65_536
    max_input_chars: int = 200_000
    cache_entries: int = 1024

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, not {self.url!r}")
        if not self.model:
            raise ValueError("model must name the model that writes summaries")
        if not self.deadline_seconds > 0:
            raise ValueError(f"deadline_seconds must be positive, not {self.deadline_seconds!r}")
        for name in ("max_response_bytes", "max_input_chars", "cache_entries"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a whole number of at least 1, not {value!r}")


@dataclass(frozen=True, slots=True)
class SummaryOutcome:
    text: str | None
    status: SummaryStatus


class Summariser:
    """Summaries of dropped spans, through `session`, cached by the span's whole digest and room
    (`SummaryRequest.cache_key`; LRU, `cache_entries`)."""

    def __init__(self, options: SummariserOptions, session: aiohttp.ClientSession, upstream: str = "") -> None:
        self.options = options
        self.session = session
        self.upstream = upstream  # the configured upstream it calls, whose credentials each call carries
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._pending: dict[str, asyncio.Future[SummaryOutcome]] = {}

    async def summarise(self, request: SummaryRequest, headers: Mapping[str, str] | None = None) -> SummaryOutcome:
        """The summary of `request`'s span: from the cache, from a call already under way for the
        same span, or from a new call sent with `headers` (the upstream's credentials) as well."""
        key = request.cache_key
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return SummaryOutcome(cached, "reused")
        pending = self._pending.get(key)
        if pending is not None:
            outcome = await asyncio.shield(pending)
            return SummaryOutcome(outcome.text, "reused") if outcome.text is not None else outcome
        future: asyncio.Future[SummaryOutcome] = asyncio.get_running_loop().create_future()
        self._pending[key] = future
        try:
            outcome = await self._call(request, headers or {})
        except BaseException:  # cancelled: the requests waiting on this call go without a summary
            future.set_result(SummaryOutcome(None, "failed"))
            raise
        finally:
            del self._pending[key]
        future.set_result(outcome)
        if outcome.text is not None:
            self._cache[key] = outcome.text
            while len(self._cache) > self.options.cache_entries:
                self._cache.popitem(last=False)
        return outcome

    async def _call(self, request: SummaryRequest, extra_headers: Mapping[str, str]) -> SummaryOutcome:
        options = self.options
        payload = {
            "model": options.model,
            "messages": summariser_messages(request, options.max_input_chars),
            "max_tokens": max(16, request.max_tokens - SUMMARY_OVERHEAD_TOKENS),
            "temperature": 0,
        }
        headers = {**options.headers, **extra_headers}
        headers.update({"Accept-Encoding": "identity", "Content-Type": "application/json"})
        try:
            async with asyncio.timeout(options.deadline_seconds):
                async with self.session.post(options.url, data=json.dumps(payload), headers=headers) as response:
                    if response.status != 200:
                        return SummaryOutcome(None, "failed")
                    raw = await response.content.read(options.max_response_bytes + 1)
                    if len(raw) > options.max_response_bytes:
                        return SummaryOutcome(None, "oversize")
        except TimeoutError:
            return SummaryOutcome(None, "timeout")
        except aiohttp.ClientError:
            return SummaryOutcome(None, "failed")
        text = _summary_text(raw)
        return SummaryOutcome(text, "produced") if text else SummaryOutcome(None, "failed")


def _summary_text(raw: bytes) -> str | None:
    try:
        data: Any = json.loads(raw)
        text = data["choices"][0]["message"]["content"]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    return text.strip() if isinstance(text, str) and text.strip() else None


def open_summariser(settings: Settings, session: aiohttp.ClientSession) -> Summariser | None:
    """The summariser `trim.summariser` names, calling its upstream's chat endpoint (credentials are
    added per call, from that upstream's own auth); None when summaries are off."""
    options = settings.trim.summariser
    if not settings.trim.summarize_dropped or options is None:
        return None
    upstream = settings.upstreams[options.upstream]
    return Summariser(
        SummariserOptions(
            url=f"{upstream.base_url}/chat/completions",
            model=options.model,
            deadline_seconds=options.deadline_seconds,
            max_response_bytes=options.max_response_bytes,
            max_input_chars=options.max_input_chars,
            cache_entries=options.cache_entries,
        ),
        session,
        upstream=upstream.name,
    )
