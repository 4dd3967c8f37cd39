"""Server-sent events as the echo upstream writes them, and the reply every API shape renders."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy.demo.echo.report import EchoReport


@dataclass(frozen=True)
class Reply:
    """One answer before it takes an API's shape: the report, its text and the token counts."""

    report: EchoReport
    text: str
    completion_tokens: int
    created: int
    suffix: str  # a random part for the ids the answer carries

    @property
    def model(self) -> str:
        return self.report.model

    @property
    def prompt_tokens(self) -> int:
        return self.report.prompt_tokens


async def open_stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    return response


def event(data: dict[str, Any] | str, name: str | None = None) -> bytes:
    """One SSE event: `data` as JSON (a string as it is), named when `name` is given."""
    payload = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {name}\n" if name is not None else ""
    return f"{head}data: {payload}\n\n".encode()
