"""Windows a request opts into with a header."""

from __future__ import annotations

import pytest

from proxy.core.models.opt_in_windows import OPT_INS, correction_key, opted_in

BETA = {"anthropic-beta": "context-1m-2025-08-07"}


class TestOptedIn:
    @pytest.mark.parametrize(
        "model",
        ["claude-sonnet-4-5", "claude-sonnet-4-5-20250929", "claude-sonnet-4-20250514", "anthropic/claude-sonnet-4-0"],
    )
    def test_sonnet_4_and_4_5_open_a_million_tokens_with_anthropics_beta_header(self, model):
        opt_in = opted_in(model, {"anthropic-beta": "prompt-caching-2024-07-31, context-1m-2025-08-07"}, OPT_INS, "messages")
        assert opt_in is not None and opt_in.context_window == 1_000_000

    @pytest.mark.parametrize("model", ["claude-sonnet-4-6", "claude-haiku-4-5", "claude-opus-4-1", "gpt-4o"])
    def test_other_models_are_not_raised_by_it(self, model):
        """Sonnet 4.6 and Opus 4.6 serve 1M by default: the map has it already."""
        assert opted_in(model, BETA, OPT_INS, "messages") is None

    def test_without_the_beta_the_model_keeps_its_own_window(self):
        assert opted_in("claude-sonnet-4-5", {}, OPT_INS, "messages") is None
        assert opted_in("claude-sonnet-4-5", {"anthropic-beta": "context-1m-2099-01-01"}, OPT_INS, "messages") is None

    def test_the_header_opens_nothing_on_a_shape_the_opt_in_does_not_name(self):
        """Anthropic's beta header is honoured on its Messages API, not on chat completions."""
        assert opted_in("claude-sonnet-4-5", BETA, OPT_INS, "chat") is None

    def test_the_header_opens_nothing_where_the_provider_honours_no_opt_in(self):
        assert opted_in("claude-sonnet-4-5", BETA, (), "messages") is None


class TestCorrectionKey:
    def test_a_request_that_opted_in_keeps_its_corrections_apart(self):
        opt_in = opted_in("claude-sonnet-4-5", BETA, OPT_INS, "messages")
        assert correction_key("claude-sonnet-4-5", None) == "claude-sonnet-4-5"
        assert correction_key("claude-sonnet-4-5", opt_in) not in ("claude-sonnet-4-5", "")
