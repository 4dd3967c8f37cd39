"""API-reported `prompt_tokens` for plain messages, images and file references, pinned: outside
tools, the count must equal the API's wherever it says it is exact, and never fall below it.

The table is tests/data/message_api_counts.json, taken from pydantic-ai's VCR cassettes (each
source is the cassette's URL at the commit that last recorded it, and the interaction used).
It covers:

- the reasoning models' reply priming (gpt-5, gpt-5.6, o3-mini: one, two and three messages,
  with and without a system message): one token fewer than gpt-4o's;
- o1-mini, which rejects `system` and `developer` messages and frames its messages in a way no
  source publishes: a flagged bound;
- gpt-4.1-nano's patch-priced image (540x360, detail auto);
- gpt-4o-search-preview, whose reported count leaves the chat framing out: a flagged bound;
- file parts sent by `file_id` (`unbounded`): the guard cannot see the file, so the count is
  below the API's by the file's size and must say so.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

TABLE = json.loads((Path(__file__).parents[2] / "data" / "message_api_counts.json").read_text())
CASES: list[dict[str, Any]] = TABLE["cases"]
BOUNDED = [c for c in CASES if not c.get("unbounded")]


def _case_id(case: dict[str, Any]) -> str:
    return f"{case['source']}-{case['model']}-{case['prompt_tokens']}"


class TestApiReportedMessageCounts:
    @pytest.mark.parametrize("case", [c for c in BOUNDED if c["exact"]], ids=_case_id)
    def test_an_exact_count_is_the_api_count(self, counter_for, case):
        count = counter_for(case["model"]).request(case["body"])
        assert (count.total, count.exact) == (case["prompt_tokens"], True)

    @pytest.mark.parametrize("case", [c for c in BOUNDED if not c["exact"]], ids=_case_id)
    def test_a_count_of_an_unpublished_framing_is_above_the_api_count_and_says_so(self, counter_for, case):
        count = counter_for(case["model"]).request(case["body"])
        assert count.total >= case["prompt_tokens"] and not count.exact and count.notes

    @pytest.mark.parametrize("case", [c for c in CASES if c.get("unbounded")], ids=_case_id)
    def test_a_file_sent_by_id_is_not_counted_and_the_count_says_so(self, counter_for, case):
        count = counter_for(case["model"]).request(case["body"])
        assert not count.exact and any("file_id" in note for note in count.notes)

    def test_every_count_that_is_not_exact_says_why(self):
        assert all(c.get("note") for c in CASES if not c["exact"])

    def test_every_case_names_a_known_source(self):
        assert {c["source"] for c in CASES} == set(TABLE["sources"])

    def test_the_reasoning_priming_is_pinned_on_two_generations(self):
        models = {c["model"].split("-20")[0] for c in CASES if "reasoning reply priming" in c["covers"] and c["exact"]}
        assert {"gpt-5", "o3-mini"} <= models
