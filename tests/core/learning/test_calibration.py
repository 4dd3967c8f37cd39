"""Calibration: the provider's `usage.prompt_tokens` over our estimate, learned per upstream and model."""

from __future__ import annotations

import json

import pytest

from proxy.core.counting.tokenizer import CharEstimateTokenizer, EncoderTokenizer
from proxy.core.learning.calibration import (
    CalibratedTokenizer,
    Calibration,
    CalibrationPolicy,
    CalibrationTable,
    calibrated,
    quantile,
)

POLICY = CalibrationPolicy()


def observed(ratios: list[float], estimate: int = 1000, policy: CalibrationPolicy = POLICY) -> Calibration:
    calibration = Calibration()
    for ratio in ratios:
        calibration = calibration.observe(round(estimate * ratio), estimate, policy)
    return calibration


class TestCalibrationPolicy:
    @pytest.mark.parametrize(
        "bad",
        [
            {"quantile": 0.2},
            {"window": 0},
            {"min_samples": 0},
            {"min_samples": 40},
            {"max_step": 1.0},
            {"min_factor": 1.5},
            {"max_factor": 0.9},
            {"headroom": -0.1},
            {"min_tokens": 0},
        ],
    )
    def test_rejects_an_out_of_range_value_naming_it(self, bad):
        with pytest.raises(ValueError, match=next(iter(bad)).split("_")[0]):
            CalibrationPolicy(**bad)


class TestObserve:
    def test_an_undercount_raises_the_factor_at_the_first_response(self):
        calibration = observed([1.6])
        assert calibration.factor == pytest.approx(1.6 * 1.02)

    def test_an_overcount_does_not_lower_the_factor_before_min_samples(self):
        assert observed([0.6, 0.6]).factor == 1.0

    def test_an_overcount_lowers_the_factor_by_at_most_max_step_per_response(self):
        factors = [observed([0.6] * n).factor for n in range(3, 6)]
        assert factors == pytest.approx([0.75, 0.5625 if 0.5625 > 0.612 else 0.612, 0.612])

    def test_a_steady_overcount_is_within_ten_percent_after_four_responses(self):
        assert observed([0.62] * 4).factor == pytest.approx(0.62, rel=0.1)

    def test_one_undercount_among_overcounts_raises_the_factor_at_once_and_it_falls_back_slowly(self):
        assert observed([0.6] * 4 + [1.3]).factor == pytest.approx(1.3 * 1.02)
        assert observed([0.6] * 4 + [1.3, 0.6]).factor == pytest.approx(1.3 * 1.02 * 0.75)

    def test_the_factor_stays_within_its_bounds(self):
        assert observed([9.0]).factor == POLICY.max_factor
        assert observed([0.01] * 20, estimate=100_000).factor == POLICY.min_factor

    def test_small_requests_teach_nothing(self):
        calibration = Calibration().observe(40, 20, POLICY)
        assert calibration == Calibration()

    def test_keeps_only_the_most_recent_ratios(self):
        policy = CalibrationPolicy(window=4, min_samples=2)
        assert len(observed([1.0] * 10, policy=policy).ratios) == 4

    def test_old_undercounts_age_out_of_the_window(self):
        policy = CalibrationPolicy(window=4, min_samples=2)
        assert observed([1.5] + [0.7] * 12, policy=policy).factor == pytest.approx(0.7 * 1.02)


class TestSerialisation:
    def test_round_trips_through_json(self):
        calibration = observed([0.7, 0.8, 0.75])
        assert Calibration.from_dict(json.loads(json.dumps(calibration.to_dict()))) == calibration

    @pytest.mark.parametrize("bad", [{}, {"factor": "x"}, {"factor": -1.0}, {"factor": 1.0, "ratios": [0.0]}])
    def test_rejects_what_is_not_a_calibration(self, bad):
        with pytest.raises(ValueError, match="not a calibration"):
            Calibration.from_dict(bad)


class TestCalibratedTokenizer:
    def test_scales_an_estimate(self):
        tokenizer = calibrated(CharEstimateTokenizer(3.0), Calibration(factor=0.5, observations=3))
        assert tokenizer.count("a" * 300) == 50
        assert tokenizer.count_many(["a" * 300, ""]) == [50, 0]
        assert not tokenizer.exact

    def test_never_scales_an_exact_tokenizer(self):
        exact = EncoderTokenizer("words", str.split)
        assert calibrated(exact, Calibration(factor=0.5, observations=3)) is exact

    def test_leaves_an_estimate_alone_until_something_is_learned(self):
        estimate = CharEstimateTokenizer(3.0)
        assert calibrated(estimate, Calibration()) is estimate
        assert calibrated(estimate, None) is estimate

    def test_has_a_name_of_its_own_so_cached_counts_do_not_mix(self):
        assert CalibratedTokenizer(CharEstimateTokenizer(3.0), 0.5).name != CharEstimateTokenizer(3.0).name


class TestCalibrationTable:
    def test_keeps_one_calibration_per_upstream_and_model(self):
        table = CalibrationTable()
        table.observe("local", "smol", 1600, 1000)
        assert table.get("local", "smol") is not None
        assert table.get("other", "smol") is None

    def test_forgets_the_least_recently_updated_beyond_max_entries(self):
        table = CalibrationTable(max_entries=2)
        for model in ("a", "b", "c"):
            table.observe("up", model, 1600, 1000)
        assert table.get("up", "a") is None and table.get("up", "c") is not None

    def test_serialises_every_entry(self):
        table = CalibrationTable()
        table.observe("up", "m", 1600, 1000)
        assert set(table.to_dict()) == {"up\tm"}


class TestQuantile:
    def test_interpolates_between_ranks(self):
        assert quantile((1.0, 2.0, 3.0, 4.0, 5.0), 0.9) == pytest.approx(4.6)
        assert quantile((2.0,), 0.9) == 2.0
