"""Where the bundled model map disagrees with the provider's own documentation, the provider wins.

litellm's map is the guard's source of windows for hosted models, and it can be wrong: it gives
`gpt-3.5-turbo-instruct` 8,192 input tokens where OpenAI documents a 4,096-token window, and a
7,731-token prompt went through untrimmed. Each entry here names the map key it corrects, the
window (and output limit) the provider documents, and the page that says so with the date it was
read. `corrected()` applies the table where the map is loaded; an entry is applied only where the
map still disagrees, so a map that has been fixed is left as it is. The request's log line names
the correction that set its window (`map_correction`).

An operator's `models.overrides` still win over both.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.apis.bedrock.model_cards import BEDROCK_CORRECTIONS
from proxy.core.models.model_registry import ModelProfile
from proxy.core.record_fields import field_dict


@dataclass(frozen=True, slots=True)
class MapCorrection:
    key: str  # the model map's key
    context_window: int  # the provider's documented context window (input and output together)
    max_output_tokens: int
    source: str  # the provider's page that documents it
    checked: str  # the date that page was read (YYYY-MM-DD)

    def to_dict(self) -> dict[str, Any]:
        return field_dict(self, {"key": "entry"})


_INSTRUCT = "https://developers.openai.com/api/docs/models/gpt-3.5-turbo-instruct"

MAP_CORRECTIONS: tuple[MapCorrection, ...] = (
    # "4,096 context window, 4,096 max output tokens"; the map says 8,192 input tokens.
    MapCorrection("gpt-3.5-turbo-instruct", 4096, 4096, _INSTRUCT, "2026-11-25"),
    # The same model's dated snapshot (the page's snapshot list); the map says 8,192 and 4,097.
    MapCorrection("gpt-3.5-turbo-instruct-0914", 4096, 4096, _INSTRUCT, "2026-11-25"),
    # "Context window: 1M tokens · Max output: 128K tokens"; litellm 1.93 (the floor) says 64,000 output.
    MapCorrection(
        "claude-sonnet-4-6",
        1_000_000,
        128_000,
        "https://platform.claude.com/docs/en/models/sonnet-4-6/overview",
        "2026-11-28",
    ),
    # "1,050,000 context window, 128,000 max output tokens": the map agrees (1.93 to 1.108); kept so a map
    # that falls back to GPT-5's 272,000 (the window Codex CLI assumes for it) is corrected.
    MapCorrection("gpt-5.5", 1_050_000, 128_000, "https://developers.openai.com/api/docs/models/gpt-5.5", "2026-11-28"),
    *(MapCorrection(*row) for row in BEDROCK_CORRECTIONS),  # AWS's Bedrock model cards
)
BY_KEY = {c.key: c for c in MAP_CORRECTIONS}


def disagrees(entry: Mapping[str, Any], correction: MapCorrection) -> bool:
    """Whether the map's `entry` states another window or output limit than the provider does."""
    window = entry.get("max_input_tokens") or entry.get("max_tokens")
    return window != correction.context_window or entry.get("max_output_tokens") != correction.max_output_tokens


def corrected(model_map: dict[str, dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], tuple[MapCorrection, ...]]:
    """`model_map` with each entry the table corrects replaced (a new dict: the map's entries are
    shared), and the corrections that applied."""
    applied = []
    for correction in MAP_CORRECTIONS:
        entry = model_map.get(correction.key)
        if entry is None or not disagrees(entry, correction):
            continue
        model_map[correction.key] = {
            **entry,
            "max_input_tokens": correction.context_window,
            "max_tokens": correction.max_output_tokens,
            "max_output_tokens": correction.max_output_tokens,
        }
        applied.append(correction)
    return model_map, tuple(applied)


def correction_for(profile: ModelProfile) -> dict[str, Any] | None:
    """The correction that set `profile`'s window, as the log writes it: its window came from a
    model map entry this table corrects, and is the corrected one."""
    if profile.window_source != "model_map" or profile.matched is None:
        return None
    correction = BY_KEY.get(profile.matched)
    if correction is None or correction.context_window != profile.context_window:
        return None
    return correction.to_dict()
