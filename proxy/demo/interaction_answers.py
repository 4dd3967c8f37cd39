"""Answers in the shape of Google's Interactions API, for every fake upstream (the echo, the
suite's): a whole `Interaction`, and the same answer as the server-sent events a streamed
interaction sends (`interaction.created`, `step.start`, `step.delta` per piece, `step.stop`,
`interaction.completed` with the usage), each named by its `event_type` as google-genai reads them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.demo.provider_answers import Usage, event


def usage(counts: Usage) -> dict[str, int]:
    """The Interactions API's usage: its totals of input, output and all tokens."""
    return {
        "total_input_tokens": counts.input,
        "total_output_tokens": counts.output,
        "total_tokens": counts.input + counts.output,
    }


NO_USAGE = Usage()


def interaction(model: str | None, text: str, *, counts: Usage = NO_USAGE, ids: str = "1") -> dict[str, Any]:
    """A completed interaction whose one model output says `text`."""
    step = {"type": "model_output", "content": [{"type": "text", "text": text}]}
    return {
        "id": f"int_{ids}",
        "object": "interaction",
        "status": "completed",
        "model": model,
        "steps": [step],
        "usage": usage(counts),
    }


def interaction_frames(whole: dict[str, Any], pieces: Sequence[str]) -> list[bytes]:
    """`whole` streamed: its text in `pieces`, its usage on the closing event."""
    started = {key: whole[key] for key in ("id", "object", "model") if key in whole}
    out = [
        event({"event_type": "interaction.created", "interaction": {**started, "status": "in_progress"}},
              "interaction.created"),
        event({"event_type": "step.start", "index": 0, "step": {"type": "model_output", "content": []}}, "step.start"),
    ]  # fmt: skip
    for piece in pieces:
        delta = {"event_type": "step.delta", "index": 0, "delta": {"type": "text", "text": piece}}
        out.append(event(delta, "step.delta"))
    out.append(event({"event_type": "step.stop", "index": 0}, "step.stop"))
    completed = {key: value for key, value in whole.items() if key != "steps"}
    out.append(event({"event_type": "interaction.completed", "interaction": completed}, "interaction.completed"))
    return out
