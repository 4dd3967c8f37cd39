"""Every figure of a `make bench` run that a doc quotes comes from bench/results.json through the
bench's writer (bench/report.py), so no page can quote an older run than the README does."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import report

ROOT = Path(__file__).parents[2]
RESULTS = json.loads((ROOT / "bench/results.json").read_text(encoding="utf-8"))
RUN_DATE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC")


class TestDocsFigures:
    def test_every_generated_section_is_what_the_published_results_give(self):
        """The README's figures, docs/deployment.md's capacity and docs/limitations.md's targets."""
        assert report.stale_sections(RESULTS, ROOT) == []

    def test_no_page_names_a_run_other_than_the_published_one(self):
        pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        quoted = {
            (page.name, date)
            for page in pages
            if page.name != "benchmarks.md"  # the report itself, with its earlier runs' history
            for date in RUN_DATE.findall(page.read_text(encoding="utf-8"))
        }
        assert quoted and {date for _, date in quoted} == {RESULTS["date"]}, quoted

    def test_a_section_written_from_another_run_is_found_stale(self, tmp_path):
        for path, (start, end, _) in report.generated_sections(RESULTS, ROOT).items():
            target = tmp_path / path.relative_to(ROOT)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(f"before\n{start}\nMeasured 2026-01-01 00:00 UTC\n{end}\nafter\n", encoding="utf-8")
        stale = ["README.md", "docs/deployment.md", "docs/limitations.md"]
        assert sorted(report.stale_sections(RESULTS, tmp_path)) == stale
        for path, (start, end, section) in report.generated_sections(RESULTS, tmp_path).items():
            report.fill_section(path, start, end, section())  # what write_docs does for each page
        assert report.stale_sections(RESULTS, tmp_path) == []


class TestTargetMet:
    @pytest.mark.parametrize(
        ("row", "met"),
        [
            ({"target": "guard < 1 s", "guard": 0.48, "ratio": 2.5}, True),
            ({"target": "guard < 90 MB", "guard": 97.4, "ratio": 2.6}, False),
            ({"target": "<= 1.15x", "guard": 1.1, "ratio": 2.0}, False),
            ({"target": ">= 0.9x", "guard": 56.2, "ratio": 1.0}, True),
            ({"target": "all 500 complete", "guard": 2.5, "ratio": 1.4}, None),
            ({"target": ">= 0.7x", "guard": None, "ratio": None}, None),
        ],
    )
    def test_the_guard_figure_or_the_ratio_is_compared_with_the_target(self, row, met):
        assert report.target_met(row) is met
