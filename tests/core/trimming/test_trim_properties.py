"""Properties of trimming over generated conversations (hypothesis).

Conversations have system prompts, named users, content-part arrays, images, parallel tool calls
with results in any order, very long tool results, and sometimes a tool exchange still in
progress after the latest user message. Whatever the window and pipeline:

- the result fits its budget, or is an explicit rejection of the untouched body;
- it is a valid request: no orphaned results, no calls missing results, history opens on a user;
- pinned messages and the latest user message are kept; messages stay in order;
- every field outside `messages` is kept; the reported tokens match a fresh recount;
- trimming the result again changes nothing.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from proxy.core.counting.request_count import RequestCounter
from proxy.core.trimming.budget import PINNED_ROLES, protected_start
from proxy.core.trimming.turns import split_conversation, validity_problems
from tests.conftest import png_data_url
from tests.support.trimming import WORDS, fit, profile, quick_split, tokenizer

text = st.lists(st.sampled_from(WORDS), min_size=1, max_size=60).map(" ".join)
long_text = st.integers(min_value=500, max_value=4000).map(lambda n: " ".join(WORDS[i % len(WORDS)] for i in range(n)))
image = st.sampled_from(
    [
        {"type": "image_url", "image_url": {"url": png_data_url(1024, 768)}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
    ]
)


@st.composite
def user_message(draw: Any) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "user"}
    if draw(st.booleans()):
        message["content"] = draw(text)
    else:
        parts = [{"type": "text", "text": draw(text)}]
        parts += draw(st.lists(image, max_size=2))
        message["content"] = parts
    if draw(st.integers(0, 4)) == 0:
        message["name"] = draw(st.sampled_from(["ana", "bo"]))
    return message


@st.composite
def tool_exchange(draw: Any, prefix: str) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 3))
    ids = [f"{prefix}_{i}" for i in range(n)]
    calls = [{"id": i, "type": "function", "function": {"name": "search", "arguments": '{"q": "x"}'}} for i in ids]
    results = [{"role": "tool", "tool_call_id": i, "content": draw(st.one_of(text, long_text))} for i in ids]
    order = draw(st.permutations(results))
    return [{"role": "assistant", "content": None, "tool_calls": calls}, *order]


@st.composite
def conversation(draw: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if draw(st.booleans()):
        messages.append({"role": "system", "content": draw(text)})
    if draw(st.integers(0, 5)) == 0:
        messages.append({"role": "developer", "content": draw(text)})
    for t in range(draw(st.integers(0, 8))):
        messages.append(draw(user_message()))
        for k in range(draw(st.integers(0, 2))):
            messages += draw(tool_exchange(f"c{t}_{k}"))
        if draw(st.booleans()):
            assistant: dict[str, Any] = {"role": "assistant", "content": draw(st.one_of(text, long_text))}
            if draw(st.integers(0, 4)) == 0:
                assistant["reasoning_content"] = draw(text)
            messages.append(assistant)
    messages.append(draw(user_message()))
    if draw(st.integers(0, 3)) == 0:
        messages += draw(tool_exchange("live"))
    body: dict[str, Any] = {"model": "gpt-4o", "messages": messages, "temperature": 0.3, "x-extra": {"k": [1]}}
    if draw(st.booleans()):
        body["max_tokens"] = draw(st.integers(100, 3000))
    return body


pipelines = st.sampled_from(
    [
        ("drop_oldest_turns", "shrink_tool_results", "shrink_messages", "drop_recent_turns", "shrink_latest_user"),
        (
            "drop_images",
            "clamp_max_tokens",
            "drop_oldest_turns",
            "shrink_tool_results",
            "shrink_messages",
            "drop_recent_turns",
            "shrink_latest_user",
        ),
        ("shrink_tool_results", "drop_oldest_turns"),
        ("drop_old_tool_exchanges", "drop_oldest_turns", "shrink_tool_results", "drop_recent_turns"),
        ("drop_oldest_turns",),
    ]
)
# drop_oldest_turns as configured by default (the opening, cache-stable cuts, partial turns), cutting
# no deeper than needed, without the partial turn, with a deep low-water mark, with a smaller
# opening, and with none.
cut_options = st.sampled_from(
    [
        {},
        {"drop_oldest_turns": {"low_water": 1.0}},
        {"drop_oldest_turns": {"keep_partial": False}},
        {"drop_oldest_turns": {"low_water": 0.3, "min_partial_tokens": 1}},
        {"drop_oldest_turns": {"low_water": 0.65, "head_share": 0.5}},
        {"drop_oldest_turns": {"head_share": 0}},
    ]
)
SETTINGS = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)


def _is_pinned(message: dict[str, Any]) -> bool:
    return message.get("role") in ("system", "developer")


def _latest_user(messages: list[dict[str, Any]]) -> int:
    return max(i for i, m in enumerate(messages) if m["role"] == "user")


@SETTINGS
@given(
    body=conversation(), window=st.integers(1500, 30000), pipeline=pipelines, options=cut_options, note=st.booleans()
)
def test_trimming_always_yields_a_valid_fitting_request_or_an_explicit_rejection(body, window, pipeline, options, note):
    result = fit(body, window, pipeline=pipeline, options=options, note=note).result
    original = body["messages"]
    event(result.outcome)

    if result.outcome == "rejected":
        assert result.body is body
        return
    assert result.outcome in ("unchanged", "trimmed")
    assert result.fits

    kept = result.body["messages"]
    assert validity_problems(kept) == validity_problems(original) == []

    # The reported count is the count of the body actually returned.
    counter = RequestCounter(profile(window), tokenizer())
    assert counter.request(result.body).total == result.tokens_after

    # The budget note, when asked for, sits just before the insertion point; the rest are originals.
    if result.note_tokens:
        assert "to fit the context window." in kept[result.insert_at - 1]["content"]
        kept = [*kept[: result.insert_at - 1], *kept[result.insert_at :]]

    # Each message is reported once.
    indices = [r.index for r in result.removals if r.index is not None]
    assert len(indices) == len(set(indices))
    removed = sum(r.tokens for r in result.removals if r.index is not None)  # not the max_tokens clamp
    assert result.tokens_before - result.tokens_after + result.note_tokens == removed

    # Order kept; dropped messages are exactly those reported as dropped.
    dropped = {r.index for r in result.removals if r.kind == "dropped"}
    survivors = [i for i in range(len(original)) if i not in dropped]
    assert len(survivors) == len(kept)
    for i, message in zip(survivors, kept, strict=True):
        assert message["role"] == original[i]["role"]
        changed = {r.index for r in result.removals if r.kind != "dropped"}
        if i not in changed:
            assert message is original[i]

    # Pinned messages and the latest user message survive.
    assert [m for m in kept if _is_pinned(m)] == [m for m in original if _is_pinned(m)]
    assert _latest_user(original) in survivors

    # Every field outside messages survives (max_tokens only lowered, by the clamp).
    for key, value in body.items():
        if key == "messages":
            continue
        if key == "max_tokens" and "clamp_max_tokens" in result.strategies:
            assert result.body[key] <= value
        else:
            assert result.body[key] == value


@SETTINGS
@given(body=conversation(), window=st.integers(1500, 30000), pipeline=pipelines, options=cut_options)
def test_trimming_is_idempotent(body, window, pipeline, options):
    first = fit(body, window, pipeline=pipeline, options=options).result
    second = fit(dict(first.body), window, pipeline=pipeline, options=options).result
    if first.outcome == "rejected":
        assert second.outcome == "rejected"
    else:
        assert second.outcome == "unchanged" and second.body["messages"] == first.body["messages"]


@SETTINGS
@given(body=conversation(), window=st.integers(1500, 30000), options=cut_options)
def test_appending_a_turn_never_moves_the_cut_back(body, window, options):
    """The same history plus one turn is cut at the same position or further on, never earlier
    (positions count from the end of the opening, so the two must keep the same opening)."""
    messages = body["messages"]
    first = fit(body, window, options=options).result
    grown = {
        **body,
        "messages": [*messages, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "next"}],
    }
    second = fit(grown, window, options=options).result
    if first.cut is not None and second.cut is not None and first.cut.reason == second.cut.reason == "low_water":
        same_opening = (first.cut.head_tokens, first.cut.head_turns) == (second.cut.head_tokens, second.cut.head_turns)
        if same_opening:
            assert second.cut.position >= first.cut.position


@given(body=conversation())
@settings(max_examples=300, deadline=None)
def test_the_quick_pinned_and_protected_indices_always_match_the_full_split(body):
    quick = quick_split(body["messages"])
    split = split_conversation(body["messages"])
    event("quick" if quick is not None else "full split needed")
    assert quick is None or quick == (split.pinned, split.protected)


@given(body=conversation())
@settings(max_examples=200, deadline=None)
def test_the_quick_fits_check_weighs_what_the_full_split_protects(body):
    """Deciding that a request fits takes the pinned messages' tokens from the count and the
    protected tail from where it starts: the same tokens the full split would never cut."""
    messages = body["messages"]
    count = RequestCounter(profile(128_000), tokenizer()).request(body)
    start = protected_start(messages)
    split = split_conversation(messages)
    if start is None:
        event("full split needed")
        return
    quick = count.pinned_tokens + sum(c.tokens for c in count.messages[start:] if c.role not in PINNED_ROLES)
    assert quick == sum(count.messages[i].tokens for i in (*split.pinned, *split.protected))
