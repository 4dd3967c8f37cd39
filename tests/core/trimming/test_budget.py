"""The input budget: window - output reserve - safety margin."""

from __future__ import annotations

import pytest

from proxy.core.trimming.budget import BudgetPolicy, input_budget

POLICY = BudgetPolicy()


class TestOutputReserve:
    @pytest.mark.parametrize(("window", "reserve"), [(8192, 1228), (2000, 500), (128000, 4096)])
    def test_defaults_to_15_percent_clamped_to_500_4096(self, window, reserve):
        assert input_budget(window, {}, 0, 0, POLICY).output_reserve == reserve

    def test_uses_max_completion_tokens_first_then_max_tokens(self):
        assert input_budget(8192, {"max_tokens": 100, "max_completion_tokens": 300}, 0, 0, POLICY).output_reserve == 300
        budget = input_budget(8192, {"max_tokens": 100}, 0, 0, POLICY)
        assert (budget.output_reserve, budget.reserve_source) == (100, "max_tokens")

    def test_ignores_booleans_and_negative_values(self):
        assert input_budget(8192, {"max_tokens": True}, 0, 0, POLICY).reserve_source == "default"
        assert input_budget(8192, {"max_tokens": -5}, 0, 0, POLICY).reserve_source == "default"


class TestInputBudget:
    def test_is_window_minus_reserve_minus_margin(self):
        budget = input_budget(8192, {}, 1000, 100, POLICY)
        assert budget.safety_margin == 410
        assert budget.input_budget == 8192 - 1228 - 410

    def test_reports_fit_and_overflow(self):
        assert input_budget(8192, {}, 6554, 0, POLICY).fits
        over = input_budget(8192, {}, 6600, 0, POLICY)
        assert not over.fits and over.overflow == 46

    def test_is_constrained_when_under_1000_tokens_remain_for_history(self):
        assert input_budget(8192, {}, 6000, 5600, POLICY).is_constrained(POLICY)
        assert not input_budget(8192, {}, 6000, 1000, POLICY).is_constrained(POLICY)

    def test_policy_is_configurable_and_checked(self):
        policy = BudgetPolicy(reserve_ratio=0.5, reserve_min=0, reserve_max=100_000, safety_ratio=0.0)
        assert input_budget(1000, {}, 0, 0, policy).input_budget == 500
        with pytest.raises(ValueError):
            BudgetPolicy(reserve_min=10, reserve_max=5)


LOWERING = BudgetPolicy(output_must_fit=False)  # llama.cpp, Ollama: the server lowers max_tokens itself


class TestAServerThatLowersMaxTokens:
    def test_a_short_prompt_with_a_large_max_tokens_fits_the_window(self):
        budget = input_budget(2048, {"max_tokens": 4096}, 7, 0, LOWERING)
        assert budget.fits and budget.output_reserve == 2048 - 103 - 7
        assert budget.reserve_source == "max_tokens_lowered_by_the_server"

    def test_a_long_prompt_is_cut_to_leave_the_minimum_output_free(self):
        budget = input_budget(2048, {"max_tokens": 4096}, 3000, 0, LOWERING)
        assert budget.output_reserve == 500 and budget.input_budget == 2048 - 500 - 103

    def test_the_minimum_output_is_configurable(self):
        policy = BudgetPolicy(output_must_fit=False, min_output=64)
        assert input_budget(2048, {"max_tokens": 4096}, 3000, 0, policy).input_budget == 2048 - 64 - 103

    def test_a_max_tokens_below_the_minimum_is_reserved_as_asked(self):
        budget = input_budget(2048, {"max_tokens": 8}, 3000, 0, LOWERING)
        assert (budget.output_reserve, budget.reserve_source) == (8, "max_tokens")

    def test_no_max_tokens_still_means_the_default_reserve(self):
        assert input_budget(2048, {}, 7, 0, LOWERING).output_reserve == 500

    def test_a_server_that_must_fit_the_output_keeps_all_that_was_asked(self):
        budget = input_budget(2048, {"max_tokens": 4096}, 7, 0, POLICY)
        assert budget.output_reserve == 4096 and not budget.fits

    def test_a_negative_minimum_output_is_refused(self):
        with pytest.raises(ValueError, match="min_output"):
            BudgetPolicy(output_must_fit=False, min_output=-1)
