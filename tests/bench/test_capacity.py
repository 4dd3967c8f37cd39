"""bench/capacity.py: the fleet arithmetic and the docs section it writes from a benchmark run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
# bench/ holds scripts, not a package: load the script as a module (registered, for its dataclasses).
spec = importlib.util.spec_from_file_location("bench_capacity", ROOT / "bench/capacity.py")
assert spec is not None and spec.loader is not None
capacity = sys.modules.setdefault("bench_capacity", importlib.util.module_from_spec(spec))
spec.loader.exec_module(capacity)


def results(**figures: float) -> dict[str, Any]:
    """A run's results in bench/run.py's shape, with the figures a test chooses."""
    f = {"warm": 500.0, "cold": 250.0, "two": 900.0, "idle": 80.0, "loaded": 150.0, "peak": 170.0, **figures}

    def row(scenario: str, metric: str, guard: float, bare: float | None = None, unit: str = "req/s") -> dict[str, Any]:
        return {"scenario": scenario, "metric": metric, "bare": bare, "guard": guard, "unit": unit, "ratio": None}

    return {
        "command": "python bench/run.py",
        "machine": "2 cores, 8 GiB, Linux, Python 3.11",
        "date": "2026-11-22 10:00 UTC",
        "rows": [
            row("throughput, 32 clients, 88 KB cold", "req/s, one worker", f["cold"], 600.0),
            row("throughput, 32 clients, 88 KB warm", "req/s, one worker", f["warm"], 600.0),
            row("throughput, 32 clients, 88 KB warm", "req/s, 2 workers vs 1", f["two"], f["warm"]),
            row("memory", "RSS after 1,000 requests (25 KB, cold)", f["loaded"], 40.0, "MB"),
            row("memory", "RSS after 20,000 / after 1,000", 1.02, 1.0, "x"),
            row("memory", "peak RSS while streaming a 100 MB response", f["peak"], 50.0, "MB"),
            row("start", "idle RSS, only o200k models configured", f["idle"], 30.0, "MB"),
        ],
    }


class TestArithmetic:
    def test_the_per_core_rate_comes_from_the_two_worker_run_on_two_cores(self):
        assert capacity.measured(results(two=900.0)).rps_per_core == 450.0

    def test_without_a_two_worker_run_one_worker_is_one_core(self):
        data = results()
        data["rows"] = [r for r in data["rows"] if "2 workers" not in r["metric"]]
        assert capacity.measured(data).rps_per_core == 500.0

    def test_pods_for_a_rate_are_planned_at_70_percent_cpu(self):
        fleet = capacity.fleet(capacity.measured(results(two=1000.0)), 10_000)
        assert fleet.pods == 29  # 10,000 / (500 x 0.7) = 28.6

    def test_a_fleet_never_has_fewer_than_two_pods(self):
        assert capacity.fleet(capacity.measured(results()), 10).pods == 2

    def test_memory_is_requested_with_headroom_in_32_mb_steps(self):
        assert capacity.memory_request_mb(capacity.measured(results(loaded=150.0))) == 192  # 187.5 -> 192

    def test_a_missing_figure_names_the_row(self):
        data = results()
        data["rows"] = [r for r in data["rows"] if r["scenario"] != "memory"]
        with pytest.raises(capacity.MissingFigure, match="'memory' / 'RSS after'"):
            capacity.measured(data)


class TestDocs:
    def test_the_section_is_written_between_the_markers_and_check_then_passes(self, tmp_path):
        results_path, docs = tmp_path / "results.json", tmp_path / "deployment.md"
        results_path.write_text(json.dumps(results()))
        docs.write_text(f"# Deploying\n\n{capacity.START}\nold\n{capacity.END}\n\nafter\n")
        args = ["--results", str(results_path), "--docs", str(docs)]
        assert capacity.main([*args, "--check"]) == 1
        assert capacity.main(args) == 0
        text = docs.read_text()
        assert (
            "| 10,000 req/s | 32 | " in text
        )  # 10,000 / (450 x 0.7) = 31.7 and "old" not in text and text.endswith("after\n")
        assert capacity.main([*args, "--check"]) == 0

    def test_the_repository_docs_have_the_markers(self):
        text = (ROOT / "docs/deployment.md").read_text()
        assert capacity.START in text and capacity.END in text
