"""The demo's Anthropic Messages request (`proxy.demo.tour` writes the conversation as Messages), sent to the
guard with the official `anthropic` SDK when it is installed, else as the same JSON over plain
HTTP. The SDK is not a runtime dependency (37 MB for one step of the demo), so `context-guard demo`
runs in full on the README's install and says which client sent the request."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import aiohttp

ANTHROPIC_VERSION = "2023-06-01"


@dataclass(frozen=True)
class Answer:
    """What came back: the status, the guard's headers, the reply's text, the echo's account of what
    arrived and the usage; `echo` is None when the request was not answered by the echo upstream."""

    status: int
    headers: dict[str, str]
    reply: str
    echo: dict[str, Any] | None
    usage: dict[str, Any] | None


def sdk_installed() -> bool:
    try:
        import anthropic  # noqa: F401  # only asked whether it is there
    except ImportError:
        return False
    return True


async def send_messages(guard_root: str, body: dict[str, Any], request_id: str, timeout: float) -> Answer:
    """`body` (model, max_tokens, system, messages, tools) to the guard's `/v1/messages`."""
    if sdk_installed():
        return await _with_the_sdk(guard_root, body, request_id, timeout)
    return await _over_http(guard_root, body, request_id, timeout)


async def _with_the_sdk(guard_root: str, body: dict[str, Any], request_id: str, timeout: float) -> Answer:
    from anthropic import APIConnectionError, APIStatusError, AsyncAnthropic

    client = AsyncAnthropic(base_url=guard_root, api_key="no-key-needed", max_retries=0, timeout=timeout)
    try:
        async with client:
            raw = await client.messages.with_raw_response.create(**body, extra_headers={"x-request-id": request_id})
            message = await raw.parse()
        reply = "".join(block.text for block in message.content if block.type == "text")
        echo = (message.model_extra or {}).get("echo")
        return Answer(raw.status_code, dict(raw.headers), reply, echo, message.usage.model_dump())
    except APIStatusError as exc:
        return Answer(exc.status_code, dict(exc.response.headers), exc.message, None, None)
    except APIConnectionError as exc:  # reported as unanswered, and the demo exits 1
        return Answer(0, {}, str(exc), None, None)


async def _over_http(guard_root: str, body: dict[str, Any], request_id: str, timeout: float) -> Answer:
    headers = {"x-request-id": request_id, "x-api-key": "no-key-needed", "anthropic-version": ANTHROPIC_VERSION}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.post(f"{guard_root}/v1/messages", json=body, headers=headers) as response,
        ):
            answer = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return Answer(0, {}, str(exc) or type(exc).__name__, None, None)
    status, got = response.status, dict(response.headers)
    if status != 200 or not isinstance(answer, dict):
        return Answer(status, got, json.dumps(answer)[:500], None, None)
    reply = "".join(str(b.get("text", "")) for b in answer.get("content", ()) if b.get("type") == "text")
    return Answer(status, got, reply, answer.get("echo"), answer.get("usage"))
