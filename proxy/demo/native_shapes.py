"""The demo's conversation said in the other API shapes the guard counts: Anthropic Messages (sent
with the anthropic SDK by `proxy.demo.tour`), and Gemini's generateContent and Google's
Interactions API, sent here with plain aiohttp.

Gemini's step uses aiohttp and JSON rather than google-genai: the SDK is not one of the guard's
runtime dependencies, and `context-guard demo` must run from a plain install; the body it sends is
the one google-genai sends (`contents` of parts, `systemInstruction`, `functionDeclarations`), to
the Developer API's path, and the answer is read as Gemini's `GenerateContentResponse`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import aiohttp

GEMINI = "gemini-2.5-flash"
REQUEST_TIMEOUT_SECONDS = 60.0


def as_anthropic(chat: Sequence[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """A chat conversation as Anthropic's `system` and `messages`: tool calls as `tool_use` blocks,
    their results as `tool_result` blocks in the user message that follows."""
    system = "\n".join(str(m["content"]) for m in chat if m["role"] == "system")
    messages: list[dict[str, Any]] = []
    for m in chat:
        if m["role"] == "assistant" and m.get("tool_calls"):
            blocks = [
                {
                    "type": "tool_use",
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "input": json.loads(c["function"]["arguments"]),
                }
                for c in m["tool_calls"]
            ]
            messages.append({"role": "assistant", "content": blocks})
        elif m["role"] == "tool":
            result = {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            if messages and messages[-1]["role"] == "user" and isinstance(messages[-1]["content"], list):
                messages[-1]["content"].append(result)
            else:
                messages.append({"role": "user", "content": [result]})
        elif m["role"] in ("user", "assistant"):
            messages.append({"role": m["role"], "content": m["content"]})
    return system, messages


def as_gemini(chat: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A chat conversation as a generateContent body: tool calls as `functionCall` parts of a model
    turn, their results as `functionResponse` parts of the user turn that follows."""
    system = "\n".join(str(m["content"]) for m in chat if m["role"] == "system")
    contents: list[dict[str, Any]] = []
    for m in chat:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [
                {
                    "functionCall": {
                        "id": c["id"],
                        "name": c["function"]["name"],
                        "args": json.loads(c["function"]["arguments"]),
                    }
                }
                for c in m["tool_calls"]
            ]
            contents.append({"role": "model", "parts": calls})
        elif m["role"] == "tool":
            name = next(
                c["function"]["name"] for a in chat for c in a.get("tool_calls") or () if c["id"] == m["tool_call_id"]
            )
            answer = {"functionResponse": {"id": m["tool_call_id"], "name": name, "response": {"output": m["content"]}}}
            if contents and contents[-1]["role"] == "user" and "functionResponse" in contents[-1]["parts"][-1]:
                contents[-1]["parts"].append(answer)
            else:
                contents.append({"role": "user", "parts": [answer]})
        elif m["role"] in ("user", "assistant"):
            contents.append({"role": "user" if m["role"] == "user" else "model", "parts": [{"text": m["content"]}]})
    declarations = [{k: t["function"][k] for k in ("name", "description", "parameters")} for t in tools]
    return {
        "systemInstruction": {"parts": [{"text": system}]},
        "contents": contents,
        "tools": [{"functionDeclarations": declarations}],
        "generationConfig": {"maxOutputTokens": 512},
    }


def as_interaction(chat: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """A chat conversation as an Interactions API body: `user_input` and `model_output` steps, tool
    calls as `function_call` steps and their results as `function_result` steps."""
    steps: list[dict[str, Any]] = []
    for m in chat:
        if m["role"] == "assistant" and m.get("tool_calls"):
            steps += [
                {"type": "function_call", "id": c["id"], "name": c["function"]["name"],
                 "arguments": json.loads(c["function"]["arguments"])}
                for c in m["tool_calls"]
            ]  # fmt: skip
        elif m["role"] == "tool":
            steps.append({"type": "function_result", "call_id": m["tool_call_id"], "result": m["content"]})
        elif m["role"] in ("user", "assistant"):
            kind = "user_input" if m["role"] == "user" else "model_output"
            steps.append({"type": kind, "content": [{"type": "text", "text": m["content"]}]})
    return {
        "model": GEMINI,
        "system_instruction": "\n".join(str(m["content"]) for m in chat if m["role"] == "system"),
        "input": steps,
        "tools": [{"type": "function", **{k: t["function"][k] for k in ("name", "description", "parameters")}}
                  for t in tools],
        "generation_config": {"max_output_tokens": 512},
    }  # fmt: skip


Sent = tuple[int, dict[str, str], str, dict[str, Any] | None, dict[str, Any] | None]


async def send_gemini(
    guard_root: str, chat: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], request_id: str
) -> Sent:
    """`chat` sent to the guard as Gemini's generateContent for `GEMINI`: the status, headers, the
    answer's text, the echo's report and the usage (none of the last three for an error)."""
    url = f"{guard_root}/v1beta/models/{GEMINI}:generateContent"
    status, headers, body = await _post(url, as_gemini(chat, tools), request_id)
    if body is None:
        return status, headers, headers.pop("error", ""), None, None
    parts = body["candidates"][0]["content"]["parts"]
    reply = "".join(p.get("text", "") for p in parts)
    return status, headers, reply, body.get("echo"), body.get("usageMetadata")


async def send_interaction(
    guard_root: str, chat: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]], request_id: str
) -> Sent:
    """`chat` sent to the guard as an interaction with `GEMINI` (Google's Interactions API), as `send_gemini`."""
    status, headers, body = await _post(f"{guard_root}/v1beta/interactions", as_interaction(chat, tools), request_id)
    if body is None:
        return status, headers, headers.pop("error", ""), None, None
    texts = [c.get("text", "") for step in body.get("steps", []) for c in step.get("content") or ()]
    return status, headers, "".join(texts), body.get("echo"), body.get("usage")


async def _post(url: str, body: dict[str, Any], request_id: str) -> tuple[int, dict[str, str], dict[str, Any] | None]:
    """The status, headers and answer of `body` posted to `url`; no answer for an error, whose
    message is then the headers' `error`."""
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
    try:
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.post(url, json=body, headers={"x-request-id": request_id}) as response,
        ):
            answer = await response.json(content_type=None)
            headers = dict(response.headers)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:  # reported as unanswered, and the demo exits 1
        return 0, {"error": str(exc)}, None
    if response.status != 200 or not isinstance(answer, dict):
        error = answer.get("error") if isinstance(answer, dict) else None
        return response.status, {**headers, "error": str((error or {}).get("message", answer))}, None
    return response.status, headers, answer
