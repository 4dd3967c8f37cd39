"""Properties of Responses and Messages requests over budget, run through the core (hypothesis).

Generated agent conversations (instructions or system blocks, questions, reasoning or thinking,
parallel tool calls whose results come back in any order, very long tool results, images, a tool
exchange still in progress at the end, unknown fields on the body and on every item) are run
through `proxy.core.plan.plan_request` with a small window. Whatever the window and pipeline:

- the result fits its budget, or is the body as received, refused;
- it is valid in the API's own rules (no orphaned function_call_output or tool_result, no call
  without its output, Messages opening with the user and alternating);
- items stay in order, pinned instructions and the latest user input stay, and every kept item
  keeps every field but the text that was shortened; unknown top-level fields are kept;
- counting the rendered body again never gives more than the core reported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.apis.anthropic.messages import MessagesAdapter
from proxy.apis.base import Adapter
from proxy.apis.openai.responses import ResponsesAdapter
from proxy.core.trimming.budget import TrimResult
from proxy.core.trimming.strategies import DEFAULT_PIPELINE, STRATEGIES
from tests.apis.fitting import fit_body
from tests.conftest import png_data_url
from tests.support.validity import messages_problems, responses_problems

WORDS = ["alpha", "beta", "gamma", "río", "数据", "{", "}", "\n", "def", "42"]
text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=40).map(" ".join)
long_text = st.integers(min_value=400, max_value=2000).map(lambda n: " ".join(WORDS[i % len(WORDS)] for i in range(n)))
PIPELINES = st.sampled_from(
    [
        DEFAULT_PIPELINE,
        ("drop_images", "drop_old_tool_exchanges", *DEFAULT_PIPELINE),
        ("drop_oldest_turns", "drop_recent_turns"),
        ("shrink_tool_results", "shrink_messages", "drop_oldest_turns", "drop_recent_turns", "shrink_latest_user"),
        tuple(STRATEGIES),  # every strategy there is, shrink_system and clamp_max_tokens included
    ]
)
PROPERTY_SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class Ids:
    def __init__(self) -> None:
        self.n = 0

    def next(self) -> int:
        self.n += 1
        return self.n


def cut(
    adapter: Adapter,
    body: dict[str, Any],
    window: int,
    model: str,
    pipeline: tuple[str, ...],
    problems: Callable[[dict[str, Any]], list[str]],
    items_field: str,
) -> tuple[dict[str, Any], TrimResult] | None:
    """The trimmed body and the core's result, after the checks every API shares: a valid input
    gives a result that fits and is valid, with every field outside `items_field` kept (the
    output reserve only ever lowered); None when the body was left as it came (it fit, or it was
    refused)."""
    assert problems(body) == []
    fitted = fit_body(adapter, body, window, model=model, pipeline=pipeline)
    result = fitted.plan.result
    event(result.outcome)
    if result.outcome in ("rejected", "unchanged"):
        assert fitted.body is body
        return None
    out = dict(fitted.body)
    assert result.fits and problems(out) == []
    reserve = adapter.parse(body).reserve_field
    kept = (items_field, reserve)
    assert {k: v for k, v in out.items() if k not in kept} == {k: v for k, v in body.items() if k not in kept}
    assert out.get(reserve, 0) <= body.get(reserve, 0)  # clamp_max_tokens may only lower it
    return out, result


# -- Responses ------------------------------------------------------------------------------


@st.composite
def responses_body(draw: Any) -> dict[str, Any]:
    ids = Ids()
    items: list[dict[str, Any]] = []

    def user() -> dict[str, Any]:
        if draw(st.booleans()):
            return {"role": "user", "content": draw(text), "x-item": ids.next()}
        parts: list[dict[str, Any]] = [{"type": "input_text", "text": draw(st.one_of(text, long_text))}]
        if draw(st.integers(0, 3)) == 0:
            parts.append({"type": "input_image", "image_url": png_data_url(800, 600), "detail": "high"})
        return {"type": "message", "role": "user", "content": parts, "x-item": ids.next()}

    def exchange(prefix: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if draw(st.booleans()):
            out.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{prefix}",
                    "summary": [{"type": "summary_text", "text": draw(text)}],
                    "x-item": ids.next(),
                }
            )
        calls = [f"{prefix}_{i}" for i in range(draw(st.integers(1, 3)))]
        out += [
            {"type": "function_call", "call_id": c, "name": "search", "arguments": '{"q": 1}', "x-item": ids.next()}
            for c in calls
        ]
        outputs = [
            {
                "type": "function_call_output",
                "call_id": c,
                "output": draw(st.one_of(text, long_text)),
                "x-item": ids.next(),
            }
            for c in calls
        ]
        return out + draw(st.permutations(outputs))

    for t in range(draw(st.integers(0, 6))):
        items.append(user())
        for k in range(draw(st.integers(0, 2))):
            items += exchange(f"c{t}_{k}")
        if draw(st.booleans()):
            items.append(
                {
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": draw(st.one_of(text, long_text)), "annotations": []}],
                    "x-item": ids.next(),
                }
            )
    items.append(user())
    if draw(st.integers(0, 3)) == 0:
        items += exchange("live")
    for position, item in enumerate(items):
        item["x-item"] = position
    body: dict[str, Any] = {"model": "gpt-4o", "input": items, "store": False, "x-extra": {"k": [1]}}
    if draw(st.booleans()):
        body["instructions"] = draw(text)
    if draw(st.booleans()):
        body["max_output_tokens"] = draw(st.integers(100, 3000))
    if draw(st.booleans()):
        body["tools"] = [
            {
                "type": "function",
                "name": "search",
                "parameters": {"type": "object", "properties": {"q": {"type": "integer"}}},
            }
        ]
    return body


def _latest_user_position(items: list[dict[str, Any]]) -> int:
    return max(k for k, item in enumerate(items) if item.get("role") == "user")


class TestResponsesOverBudget:
    @PROPERTY_SETTINGS
    @given(body=responses_body(), window=st.integers(1200, 12_000), pipeline=PIPELINES)
    def test_the_result_fits_is_valid_and_keeps_what_it_must(
        self, body: dict[str, Any], window: int, pipeline: tuple[str, ...]
    ) -> None:
        adapter = ResponsesAdapter()
        trimmed = cut(adapter, body, window, "gpt-4o", pipeline, responses_problems, "input")
        if trimmed is None:
            return
        out, result = trimmed
        originals = {item["x-item"]: item for item in body["input"]}
        kept = [item["x-item"] for item in out["input"]]
        assert kept == sorted(kept)
        latest = body["input"][_latest_user_position(body["input"])]["x-item"]
        assert latest in kept
        for item in out["input"]:
            original = originals[item["x-item"]]
            assert {k: v for k, v in item.items() if k not in ("content", "output")} == {
                k: v for k, v in original.items() if k not in ("content", "output")
            }
        recount = fit_body(adapter, out, window, pipeline=pipeline).plan.count.total
        assert recount == result.tokens_after


# -- Anthropic Messages ---------------------------------------------------------------------


@st.composite
def messages_body(draw: Any) -> dict[str, Any]:
    ids = Ids()
    messages: list[dict[str, Any]] = []

    def user_text() -> dict[str, Any]:
        if draw(st.booleans()):
            return {"role": "user", "content": draw(text)}
        blocks: list[dict[str, Any]] = [
            {"type": "text", "text": draw(st.one_of(text, long_text)), "x-block": ids.next()}
        ]
        if draw(st.integers(0, 3)) == 0:
            blocks.insert(
                0,
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": "image/png",
                        "data": png_data_url(900, 700).split(",", 1)[1],
                    },
                },
            )
        return {"role": "user", "content": blocks}

    def tool_round(prefix: str) -> list[dict[str, Any]]:
        uses = [f"toolu_{prefix}_{i}" for i in range(draw(st.integers(1, 3)))]
        blocks: list[dict[str, Any]] = []
        if draw(st.booleans()):
            blocks.append({"type": "thinking", "thinking": draw(text), "signature": f"sig-{prefix}"})
        if draw(st.booleans()):
            blocks.append({"type": "text", "text": draw(text)})
        blocks += [{"type": "tool_use", "id": u, "name": "read", "input": {"path": u}} for u in uses]
        results = [
            {
                "type": "tool_result",
                "tool_use_id": u,
                "content": draw(st.one_of(text, long_text)),
                "x-block": ids.next(),
            }
            for u in uses
        ]
        answer: list[dict[str, Any]] = list(draw(st.permutations(results)))
        if draw(st.integers(0, 2)) == 0:
            answer.append({"type": "text", "text": draw(text)})
        return [{"role": "assistant", "content": blocks}, {"role": "user", "content": answer}]

    for t in range(draw(st.integers(0, 6))):
        messages.append(user_text())
        for k in range(draw(st.integers(0, 2))):
            messages += tool_round(f"{t}_{k}")
        messages.append({"role": "assistant", "content": draw(st.one_of(text, long_text))})
    messages.append(user_text())
    if draw(st.integers(0, 3)) == 0:
        messages += tool_round("live")
    blocks = [b for m in messages if isinstance(m["content"], list) for b in m["content"] if "x-block" in b]
    for position, block in enumerate(blocks):
        block["x-block"] = position
    body: dict[str, Any] = {
        "model": "claude-sonnet-4-5",
        "max_tokens": draw(st.integers(256, 3000)),
        "messages": messages,
        "metadata": {"user_id": "u"},
        "x-extra": [1],
    }
    if draw(st.booleans()):
        body["system"] = [{"type": "text", "text": draw(text), "cache_control": {"type": "ephemeral"}}]
    if draw(st.booleans()):
        body["tools"] = [
            {"name": "read", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}
        ]
    return body


class TestMessagesOverBudget:
    @PROPERTY_SETTINGS
    @given(body=messages_body(), window=st.integers(1500, 15_000), pipeline=PIPELINES)
    def test_the_result_fits_is_valid_and_keeps_what_it_must(
        self, body: dict[str, Any], window: int, pipeline: tuple[str, ...]
    ) -> None:
        adapter = MessagesAdapter()
        trimmed = cut(adapter, body, window, "claude-sonnet-4-5", pipeline, messages_problems, "messages")
        if trimmed is None:
            return
        out, result = trimmed
        original_blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
        for message in out["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else ():
                if block["type"] in ("thinking", "tool_use"):
                    assert block in original_blocks  # never altered
                if "x-block" in block:
                    original = next(b for b in original_blocks if b.get("x-block") == block["x-block"])
                    assert {k: v for k, v in block.items() if k not in ("content", "text")} == {
                        k: v for k, v in original.items() if k not in ("content", "text")
                    }
        kept = [
            b["x-block"]
            for m in out["messages"]
            if isinstance(m["content"], list)
            for b in m["content"]
            if "x-block" in b
        ]
        assert kept == sorted(kept)
        assert out["messages"][-1]["role"] == body["messages"][-1]["role"]
        recount = fit_body(adapter, out, window, model="claude-sonnet-4-5", pipeline=pipeline).plan.count.total
        assert recount <= result.tokens_after
