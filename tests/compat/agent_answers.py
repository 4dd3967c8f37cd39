"""What the agent CLIs' scripted model answers beyond one item: a Responses answer of several
output items (an encrypted reasoning item before the call, as a reasoning model answers a
`store: false` request that asks `include: ["reasoning.encrypted_content"]`; a compaction item
for Codex's `compaction_trigger`), streamed as OpenAI does, and the usage each answer reports:
the request's input as the provider would count it, so that a client deciding when to compact
from the reported usage (Claude Code, Codex CLI) decides as it would against the real API.

Built on `proxy.demo.provider_answers` (each item's own events); only the multi-item framing and
the ciphertexts are this module's.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from proxy.demo import provider_answers as answers
from proxy.demo.provider_answers import Event

# The summary the scripted model writes when a client compacts; the step after it must start from it.
SUMMARY = "Summary of the task so far: the files were read one by one with the shell; keep reading the next one."
ITEM_EVENTS = ("response.output_item.added", "response.output_item.done")
ENCRYPTED_SUMMARY = base64.b64encode(SUMMARY.encode()).decode()  # what the compaction item carries
REASONING_BYTES = 480  # a short reasoning item's ciphertext, base64: 640 characters


def ciphertext(seed: str, size: int = REASONING_BYTES) -> str:
    """Opaque base64 of `size` bytes, different for every `seed`: what a provider's encrypted
    content looks like to the client (it cannot read it, only send it back)."""
    blocks = b"".join(hashlib.sha256(f"{seed}:{k}".encode()).digest() for k in range(size // 32 + 1))
    return base64.b64encode(blocks[:size]).decode()


def reasoning_item(ids: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": f"rs_{ids}", "summary": [], "encrypted_content": ciphertext(ids)}


def compaction_item(ids: str) -> dict[str, Any]:
    """The item the Responses API answers a compaction with: the summary, encrypted (here plainly
    encoded, so a test can find it again in the next request)."""
    return {"type": "compaction", "id": f"cmp_{ids}", "encrypted_content": ENCRYPTED_SUMMARY}


def response_stream(model: str | None, items: list[dict[str, Any]], **fields: Any) -> list[Event]:
    """The events of a Response holding `items` in order (`fields` as `provider_answers.response`
    takes them): each item's own events at its output index, one `response.created` first and one
    `response.completed` last."""
    events: list[Event] = []
    for index, item in enumerate(items):
        if item["type"] in ("message", "function_call"):
            text = item["content"][0]["text"] if item["type"] == "message" else None
            pieces = answers.words(text) if text else None
            own = answers.response_events(model, item, pieces=pieces, part_events=True, **fields)
            own = own[1:-1]  # the item's events, without its own created and completed
        else:  # reasoning, compaction: added and done whole
            own = [(name, {"type": name, "output_index": index, "item": item}) for name in ITEM_EVENTS]
        for name, data in own:
            if "output_index" in data:
                data["output_index"] = index
            events.append((name, data))
    created = answers.response(model, [], status="in_progress", **fields)
    events.insert(0, ("response.created", {"type": "response.created", "response": created}))
    done = answers.response(model, items, **fields)
    events.append(("response.completed", {"type": "response.completed", "response": done}))
    for n, (_, data) in enumerate(events):
        data["sequence_number"] = n
    return events
