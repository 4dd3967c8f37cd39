"""What a provider answers, in each API's own shape, built in one place for every fake upstream:
the echo upstream (`proxy.demo.echo`), the suite's (`tests.support.upstream`), the
client-compatibility suite's (`tests.compat.recording_upstream`) and the benchmark's
(`bench/servers.py`, which serializes its fixed answer once at start). A chat completion and its
stream chunks, a Responses API response and its events, a legacy text completion and its chunks,
an Anthropic message and its events, a Gemini GenerateContentResponse, an embeddings list; and
`event`/`frames`, the one spelling of a server-sent event.

Plain data in, plain data out (no I/O, nothing of the guard imported): each builder takes what
differs between the upstreams (ids, model, the answer, how its text is streamed, usage, the
details a strict client needs), and returns a dict the caller may extend (the echo adds its
report). A stream is a list of `Event`s, written out by `frames`.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Event = tuple[str | None, dict[str, Any]]  # an SSE event's name (None: a bare `data:` line) and its data
DONE = b"data: [DONE]\n\n"  # how OpenAI's chat and text completion streams end


@dataclass(frozen=True)
class ToolCall:
    """An answer that calls a tool rather than speaking."""

    name: str
    arguments: str  # JSON text


Answer = str | ToolCall


@dataclass(frozen=True)
class Usage:
    """The tokens an answer reports, spelled per API."""

    input: int = 10
    output: int = 3

    def chat(self) -> dict[str, int]:
        return {"prompt_tokens": self.input, "completion_tokens": self.output, "total_tokens": self.input + self.output}

    def responses(self) -> dict[str, Any]:
        return {
            "input_tokens": self.input,
            "output_tokens": self.output,
            "total_tokens": self.input + self.output,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }

    def anthropic(self) -> dict[str, int]:
        return {"input_tokens": self.input, "output_tokens": self.output}

    def gemini(self) -> dict[str, int]:
        return {
            "promptTokenCount": self.input,
            "candidatesTokenCount": self.output,
            "totalTokenCount": self.input + self.output,
        }


def words(text: str, per: int = 1) -> list[str]:
    """`text` as a provider streams it, `per` words a piece, each piece keeping the space after it
    (joined, the pieces give `text` back)."""
    split = text.split(" ")
    return [" ".join(split[i : i + per]) + (" " if i + per < len(split) else "") for i in range(0, len(split), per)]


def event(data: dict[str, Any] | str, name: str | None = None) -> bytes:
    """One server-sent event: `data` as compact JSON, as the providers write it (a string as it
    is), named when `name` is given."""
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = "" if name is None else f"event: {name}\n"
    return f"{head}data: {payload}\n\n".encode()


def frames(events: Iterable[Event], done: bool = False) -> list[bytes]:
    """`events` as server-sent event frames, with OpenAI's `[DONE]` last if `done`."""
    out = [event(data, name) for name, data in events]
    return [*out, DONE] if done else out


# -- OpenAI chat completions ----------------------------------------------------------------


def _chat_message(answer: Answer, ids: str) -> tuple[dict[str, Any], str]:
    if isinstance(answer, str):
        return {"role": "assistant", "content": answer}, "stop"
    call = {"id": f"call_{ids}", "type": "function", "function": {"name": answer.name, "arguments": answer.arguments}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"


def chat_completion(
    model: str | None,
    answer: Answer,
    *,
    ids: str = "1",
    created: int = 1,
    usage: Usage = Usage(),
    logprobs: bool = False,
) -> dict[str, Any]:
    """A chat completion saying `answer` (or calling its tool); `ids` ends every id in it, and
    `logprobs` adds the `"logprobs": null` OpenAI writes in each choice."""
    message, finish = _chat_message(answer, ids)
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
    if logprobs:
        choice["logprobs"] = None
    return {
        "id": f"chatcmpl-{ids}",
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [choice],
        "usage": usage.chat(),
    }


def chat_chunks(
    model: str | None,
    answer: Answer,
    *,
    pieces: Sequence[str] | None = None,
    framed: bool = False,
    ids: str = "1",
    created: int = 1,
    logprobs: bool = False,
    usage: Usage | None = None,
) -> list[Event]:
    """The chunks streaming `answer`: its text in `pieces` (whole by default), or its tool call in
    one chunk. `framed` opens with the role and closes with the finish reason, as OpenAI does;
    `usage` (what `stream_options.include_usage` asks for) adds `"usage": null` to each chunk and
    a last chunk with no choices that carries it."""
    message, finish = _chat_message(answer, ids)
    head = {"id": f"chatcmpl-{ids}", "object": "chat.completion.chunk", "created": created, "model": model}
    if usage is not None:
        head["usage"] = None

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> Event:
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        if logprobs:
            choice["logprobs"] = None
        return None, {**head, "choices": [choice]}

    if isinstance(answer, ToolCall):
        chunks = [chunk({"tool_calls": [{"index": 0, **message["tool_calls"][0]}]})]
    else:
        chunks = [chunk({"content": piece}) for piece in ((answer,) if pieces is None else pieces)]
    if framed:
        chunks = [chunk({"role": "assistant", "content": ""}), *chunks, chunk({}, finish)]
    if usage is not None:
        chunks.append((None, {**head, "choices": [], "usage": usage.chat()}))
    return chunks


# -- OpenAI legacy text completions ---------------------------------------------------------


def text_completion(
    model: str | None, text: str, *, ids: str = "1", created: int = 1, usage: Usage = Usage()
) -> dict[str, Any]:
    """A text completion of `text`."""
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": "stop"}
    head = {"id": f"cmpl-{ids}", "object": "text_completion", "created": created, "model": model}
    return {**head, "choices": [choice], "usage": usage.chat()}


def text_completion_chunks(
    model: str | None, pieces: Sequence[str], *, ids: str = "1", created: int = 1, usage: Usage | None = None
) -> list[Event]:
    """The chunks streaming a text completion in `pieces`, the last naming the finish reason; with
    `usage`, then a chunk with no choices that carries it."""
    head = {"id": f"cmpl-{ids}", "object": "text_completion", "created": created, "model": model}
    choices = [{"text": piece, "index": 0, "logprobs": None, "finish_reason": None} for piece in pieces]
    choices.append({"text": "", "index": 0, "logprobs": None, "finish_reason": "stop"})
    chunks: list[Event] = [(None, {**head, "choices": [choice]}) for choice in choices]
    if usage is not None:
        chunks.append((None, {**head, "choices": [], "usage": usage.chat()}))
    return chunks


# -- OpenAI Responses -----------------------------------------------------------------------


def response_item(answer: Answer, *, ids: str = "1") -> dict[str, Any]:
    """The output item saying `answer` (a message) or calling its tool (a function call)."""
    if isinstance(answer, ToolCall):
        return {
            "type": "function_call",
            "id": f"fc_{ids}",
            "call_id": f"call_{ids}",
            "name": answer.name,
            "arguments": answer.arguments,
            "status": "completed",
        }
    text = {"type": "output_text", "text": answer, "annotations": []}
    return {"type": "message", "id": f"msg_{ids}", "status": "completed", "role": "assistant", "content": [text]}


def response(
    model: str | None,
    output: list[dict[str, Any]],
    *,
    status: str = "completed",
    ids: str = "1",
    created: int = 1,
    usage: Usage = Usage(),
    tool_choice: Any = "auto",
    tools: Sequence[Any] = (),
    every_field: bool = False,
    previous_response_id: str | None = None,
    **more: Any,
) -> dict[str, Any]:
    """A Response holding `output`. `every_field` adds the fields OpenAI always writes (`error`,
    `incomplete_details`, `previous_response_id`, and `usage` null until completed); `more` adds
    or replaces top-level fields (what a Response repeats of its request: `instructions`, ...)."""
    answer = {
        "id": f"resp_{ids}",
        "object": "response",
        "created_at": created,
        "status": status,
        "model": model,
        "output": output,
        "parallel_tool_calls": True,
        "tool_choice": tool_choice,
        "tools": list(tools),
        "usage": usage.responses(),
    }
    if every_field:
        answer |= {"error": None, "incomplete_details": None, "previous_response_id": previous_response_id}
        answer["usage"] = usage.responses() if status == "completed" else None
    return answer | more


def response_events(
    model: str | None,
    item: dict[str, Any],
    *,
    pieces: Sequence[str] | None = None,
    part_events: bool = False,
    **fields: Any,
) -> list[Event]:
    """The events streaming a Response of one `item` (`fields` as `response` takes them): its text
    in `pieces` (whole by default). `part_events` adds what OpenAI sends around the text
    (`response.in_progress`, `content_part.added`/`.done`, `output_text.done`) and a call's
    arguments (`function_call_arguments.delta`/`.done`), each item first added empty and in progress."""
    events: list[Event] = []

    def event(kind: str, **data: Any) -> None:
        events.append((kind, {"type": kind, **data}))

    event("response.created", response=response(model, [], status="in_progress", **fields))
    if part_events:
        event("response.in_progress", response=response(model, [], status="in_progress", **fields))
    where = {"item_id": item["id"], "output_index": 0}
    if item["type"] == "message":
        text = item["content"][0]["text"]
        part = {**where, "content_index": 0}
        if part_events:
            event("response.output_item.added", output_index=0, item={**item, "status": "in_progress", "content": []})
            event("response.content_part.added", **part, part={**item["content"][0], "text": ""})
        else:
            event("response.output_item.added", output_index=0, item=item)
        for piece in (text,) if pieces is None else pieces:
            event("response.output_text.delta", **part, delta=piece, logprobs=[])
        if part_events:
            event("response.output_text.done", **part, text=text, logprobs=[])
            event("response.content_part.done", **part, part=item["content"][0])
    elif part_events:
        event("response.output_item.added", output_index=0, item={**item, "status": "in_progress", "arguments": ""})
        event("response.function_call_arguments.delta", **where, delta=item["arguments"])
        event("response.function_call_arguments.done", **where, arguments=item["arguments"])
    else:
        event("response.output_item.added", output_index=0, item=item)
    event("response.output_item.done", output_index=0, item=item)
    event("response.completed", response=response(model, [item], **fields))
    for n, (_, data) in enumerate(events):
        data["sequence_number"] = n
    return events


# -- Anthropic Messages ---------------------------------------------------------------------


def anthropic_message(model: str | None, answer: Answer, *, ids: str = "1", usage: Usage = Usage()) -> dict[str, Any]:
    """An Anthropic message saying `answer` (a text block) or calling its tool (a tool_use block)."""
    if isinstance(answer, ToolCall):
        block = {"type": "tool_use", "id": f"toolu_{ids}", "name": answer.name, "input": json.loads(answer.arguments)}
        stop = "tool_use"
    else:
        block, stop = {"type": "text", "text": answer}, "end_turn"
    return {
        "id": f"msg_{ids}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [block],
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage.anthropic(),
    }


def anthropic_events(message: dict[str, Any], *, pieces: Sequence[str] | None = None) -> list[Event]:
    """The events streaming `message`: its text in `pieces` (whole by default), or its tool's input
    as one JSON delta."""
    (block,) = message["content"]
    if block["type"] == "text":
        opening: dict[str, Any] = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": piece} for piece in ((block["text"],) if pieces is None else pieces)]
    else:
        opening = {**block, "input": {}}
        deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
    ending = {
        "type": "message_delta",
        "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
        "usage": {"output_tokens": message["usage"]["output_tokens"]},
    }
    return [
        ("message_start", {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}}),
        ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": opening}),
        *[("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": d}) for d in deltas],
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", ending),
        ("message_stop", {"type": "message_stop"}),
    ]


# -- Gemini generateContent ----------------------------------------------------------------


def gemini_response(
    model: str | None,
    answer: str | Sequence[dict[str, Any]],
    *,
    usage: Usage = Usage(),
    finished: bool = True,
    ids: str | None = None,
) -> dict[str, Any]:
    """A GenerateContentResponse (or one piece of a stream of them) saying `answer` (a text, or the
    parts to send as they are: a `functionCall`, ...); `finished` adds the finish reason, `ids` a
    `responseId`."""
    parts = [{"text": answer}] if isinstance(answer, str) else list(answer)
    candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
    if finished:
        candidate["finishReason"] = "STOP"
    body = {"candidates": [candidate], "usageMetadata": usage.gemini(), "modelVersion": model}
    return body if ids is None else {**body, "responseId": ids}


def gemini_frames(pieces: Sequence[dict[str, Any]], sse: bool) -> list[bytes]:
    """A Gemini stream as Google writes it: server-sent events ended by CRLF pairs when the request
    asked `?alt=sse`, else one JSON array written piece by piece (`[`, then `,` between, then `]`)."""
    if sse:
        return [b"data: " + json.dumps(piece).encode() + b"\r\n\r\n" for piece in pieces]
    array = [(b"[" if k == 0 else b",\r\n") + json.dumps(piece).encode() for k, piece in enumerate(pieces)]
    return [*array, b"]"]


# -- OpenAI embeddings ----------------------------------------------------------------------


def embedding_inputs(value: object) -> list[Any] | None:
    """The inputs of an embeddings request's `input` (one text, one list of token ids, or a list of
    either), or None when it is none of these."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [value]  # one input as token ids
    if isinstance(value, list) and value and all(isinstance(v, (str, list)) for v in value):
        return value
    return None


def embeddings(
    model: str | None, vectors: Sequence[Sequence[float]], *, tokens: int, as_base64: bool = False
) -> dict[str, Any]:
    """An embeddings list of `vectors`, one per input, as floats or, with `as_base64` (what the
    openai SDK asks for), as base64 of little-endian float32s; `tokens` the inputs' usage."""
    data = [
        {"object": "embedding", "index": i, "embedding": _packed(vector) if as_base64 else list(vector)}
        for i, vector in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def _packed(vector: Sequence[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
