"""API-reported `usage.input_tokens` for OpenAI Responses requests (`POST /v1/responses` and its
count endpoint), pinned: the guard's count of the Responses chat view must equal the API's where
it says it is exact, never fall below it where it says it is a bound, and say what it cannot see
where it is neither.

The table is tests/data/responses_api_counts.json, taken from pydantic-ai's VCR cassettes (each
source is the cassette's URL at the commit that last recorded it, and the interaction used).
Each case has a `kind`:

- `exact`: plain input, `instructions` (a system message with its own frame), assistant history,
  a data-URL image, the reasoning models' priming, gpt-5's assistant history (2 more per
  assistant message, its `<|channel|>final`), and gpt-oss's harmony system message;
- `bound`: Responses function tools (6 to 8 below chat's rendering), `context_management`,
  gpt-4.1-mini's Responses framing (0 and 1 above chat's);
- `unbounded`: what the provider adds and the guard cannot see: hosted tools (web_search,
  code_interpreter, image_generation, mcp, file_search), encrypted reasoning re-sent,
  `previous_response_id`, `conversation`, a file fetched by URL, `reasoning.mode`;
- `superseded`: recorded on 2025-03-27, in the Responses API's first weeks; the same request
  recorded again on 2025-04-07 counts 18 fewer, as the guard does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.apis.base import Parsed
from proxy.apis.openai.responses import ResponsesAdapter
from proxy.core.counting.count_rules import RequestCount
from proxy.core.counting.request_count import RequestCounter
from proxy.core.models.model_registry import ModelRegistry
from proxy.tokenizers.vocabularies import Tokenizers

TABLE = json.loads((Path(__file__).parents[2] / "data" / "responses_api_counts.json").read_text())
CASES: list[dict[str, Any]] = TABLE["cases"]
BY_SOURCE = {c["source"]: c for c in CASES}
ADAPTER = ResponsesAdapter()


def _case_id(case: dict[str, Any]) -> str:
    return f"{case['source']}-{case['model']}-{case['input_tokens']}"


def _of(kind: str) -> list[dict[str, Any]]:
    return [c for c in CASES if c["kind"] == kind]


@pytest.fixture(scope="module")
def count_of(registry: ModelRegistry, tokenizers: Tokenizers) -> Any:
    """Counts a case the way the handler does: the adapter's view, with the adapter's profile."""

    def count(case: dict[str, Any]) -> tuple[Parsed, RequestCount]:
        parsed = ADAPTER.parse(case["body"])
        profile = ADAPTER.profile(registry.profile(case["model"]), parsed)
        return parsed, RequestCounter(profile, tokenizers.get(profile.tokenizer)).request(parsed.chat)

    return count


class TestApiReportedResponsesCounts:
    @pytest.mark.parametrize("case", _of("exact"), ids=_case_id)
    def test_an_exact_count_is_the_api_count(self, count_of, case):
        parsed, count = count_of(case)
        assert count.total == case["input_tokens"] and count.exact and parsed.exact and not parsed.server_state

    @pytest.mark.parametrize("case", _of("bound"), ids=_case_id)
    def test_a_bound_is_never_below_the_api_count_and_names_why(self, count_of, case):
        parsed, count = count_of(case)
        notes = (*parsed.notes, *count.notes)
        assert count.total >= case["input_tokens"] and not (count.exact and parsed.exact)
        assert not parsed.server_state and any(case["note"] in note for note in notes)

    @pytest.mark.parametrize("case", _of("unbounded"), ids=_case_id)
    def test_what_the_provider_adds_makes_the_count_no_bound_and_is_named(self, count_of, case):
        parsed, _ = count_of(case)
        unseen = [note for note in parsed.notes if note.startswith("not counted, no bound")]
        assert parsed.server_state and not parsed.exact and any(case["note"] in note for note in unseen)

    @pytest.mark.parametrize("case", _of("superseded"), ids=_case_id)
    def test_a_first_weeks_recording_predates_the_rerecording_that_matches(self, case):
        assert case["recorded"] < "2025-04-07"

    def test_the_superseded_request_recorded_again_counts_what_the_guard_counts(self, count_of):
        early = next(c for c in _of("superseded") if c.get("superseded_by"))
        later = BY_SOURCE[early["superseded_by"]]
        _, count = count_of(later)
        same_request = {k: v for k, v in later["body"].items() if k != "stream"} == early["body"]
        assert same_request and count.total == later["input_tokens"] < early["input_tokens"]

    def test_every_case_names_a_known_source(self):
        assert {c["source"] for c in CASES} == set(TABLE["sources"])

    def test_every_hosted_tool_is_pinned_as_unbounded(self):
        covered = {item for c in _of("unbounded") for item in c["covers"]}
        hosted = {"web_search", "code_interpreter", "image_generation", "mcp", "file_search"}
        assert {f"hosted tool {name}" for name in hosted} <= covered
