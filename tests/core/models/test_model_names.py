"""`url_model_name`: only a plain path segment is ever written into an upstream URL."""

from __future__ import annotations

import pytest

from proxy.core.models.model_names import MAX_CHARS, url_model_name


class TestUrlModelName:
    @pytest.mark.parametrize(
        "name", ["gemini-2.5-pro", "gemini-1.5-flash-001", "claude-3-5-sonnet@20240620", "gemma_3", "m", "A1.b"]
    )
    def test_a_model_name_of_one_plain_segment_is_kept(self, name):
        assert url_model_name(name) == name

    @pytest.mark.parametrize(
        "name",
        ["", "..", "a..b", "a/b", "a?b", "a#b", "a%2Fb", "a b", "a\tb", "a\nb", "a:predict", ".a", "a.", "-a",
         "a\\b", "é", "a" * (MAX_CHARS + 1)],
    )  # fmt: skip
    def test_any_other_name_is_refused(self, name):
        assert url_model_name(name) is None
