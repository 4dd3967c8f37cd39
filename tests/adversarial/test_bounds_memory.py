"""Counting a body costs memory proportional to it, whatever its text (docs/security.md): prose,
one short word repeated and CJK alike.

Each body is parsed and counted in a process of its own (`memory_probe.py`), which reports its
peak RSS above what it held with the body's bytes read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.memory_bounds import PEAK_FIXED_MB, PEAK_PER_BODY_MB

ROOT = Path(__file__).resolve().parents[2]
KINDS = ["prose", "a-repeated", "cjk", "random-letters", "whitespace"]


def probe(kind: str, size_mb: float, model: str = "gpt-4o", *options: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "adversarial" / "memory_probe.py"), kind, str(size_mb), model, *options],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)  # type: ignore[no-any-return]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS is reset through Linux's /proc")
class TestPeakMemory:
    @pytest.mark.parametrize("kind", KINDS)
    def test_a_4_mb_body_stays_within_the_bound(self, kind: str) -> None:
        result = probe(kind, 4)
        assert result["peak_mb"] <= PEAK_PER_BODY_MB * result["body_mb"] + PEAK_FIXED_MB, result

    @pytest.mark.components
    @pytest.mark.parametrize("kind", KINDS)
    def test_a_30_mb_body_stays_within_the_bound(self, kind: str) -> None:
        result = probe(kind, 30)
        assert result["peak_mb"] <= PEAK_PER_BODY_MB * result["body_mb"] + PEAK_FIXED_MB, result

    def test_a_stretch_that_was_bounded_is_in_the_notes(self) -> None:
        result = probe("random-letters", 1)
        assert any("an upper bound" in note for note in result["notes"])  # type: ignore[attr-defined]


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS is reset through Linux's /proc")
class TestPeakMemoryOfABound:
    """A model counted by a bound (Claude; Gemini, Gemma and unknown names alike) counts through the
    exact tokenizers' slices, so its peak memory is bounded by the body's size as theirs is."""

    @pytest.mark.parametrize("kind", KINDS)
    def test_a_4_mb_body_counted_for_claude_stays_within_the_bound(self, kind: str) -> None:
        result = probe(kind, 4, "claude-3-5-sonnet-20241022")
        assert result["peak_mb"] <= PEAK_PER_BODY_MB * result["body_mb"] + PEAK_FIXED_MB, result

    @pytest.mark.parametrize("model", ["claude-3-5-sonnet-20241022", "gemini-1.5-pro"])
    def test_a_gzip_upload_of_30_mb_of_letters_stays_within_the_bound(self, model: str) -> None:
        """Six times the body: here the inflated body is not held before, as the uncompressed one
        is, but made from the upload within the measure."""
        result = probe("random-letters", 30, model, "gzip")
        assert result["peak_mb"] <= 6 * result["body_mb"], result


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="peak RSS is reset through Linux's /proc")
class TestPeakMemoryOfDenseJson:
    """Dense JSON in a field the guard does not read (30 MiB of `[],`, or a 30 KB gzip upload of it)
    would parse into objects many times its size: its values are weighed before parsing, the body
    is refused, and one just within the density allowed stays under six times its size."""

    @pytest.mark.parametrize("options", [(), ("gzip",)], ids=["plain", "gzip"])
    def test_30_mb_of_empty_arrays_is_refused_before_it_is_parsed(self, options: tuple[str, ...]) -> None:
        result = probe("dense-json", 30, "gpt-4o", *options)
        assert result["tokens"] is None and "refused" in result["notes"][0], result  # type: ignore[index]
        assert result["peak_mb"] <= 6 * result["body_mb"], result

    @pytest.mark.parametrize("options", [(), ("gzip",)], ids=["plain", "gzip"])
    def test_30_mb_at_the_density_allowed_is_parsed_within_six_times_the_body(self, options: tuple[str, ...]) -> None:
        result = probe("dense-json-spaced", 30, "gpt-4o", *options)
        assert result["tokens"] is not None, result
        assert result["peak_mb"] <= 6 * result["body_mb"], result
