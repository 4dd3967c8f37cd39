"""Recognising a client's own compaction request by its latest user message, or by a compaction
trigger an adapter put in the view."""

from __future__ import annotations

import pytest

from proxy.core.trimming.clearing import compiled_patterns, is_compaction_request
from proxy.core.trimming.turns import TRIGGER

CLAUDE_CODE = (
    "Your task is to create a detailed summary of the conversation so far, paying close attention to the "
    "user's explicit requests and your previous actions."
)
# Claude Code 2.1.197's other two, as its npm package holds them, after its "CRITICAL: Respond with TEXT ONLY."
CLAUDE_CODE_WHOLE = (
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\nYour task is to create a detailed summary of this "
    "conversation. This summary will be placed at the start of a continuing session"
)
CLAUDE_CODE_PARTIAL = (
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\nYour task is to create a detailed summary of the "
    "RECENT portion of the conversation \u2014 the messages that follow earlier retained context."
)
GEMINI_CLI = "First, reason in your scratchpad. Then, generate the <state_snapshot>."
CODEX = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM that will "
    "resume the task."
)


def asks(text: object, extra: tuple[str, ...] = ()) -> bool:
    messages = [{"role": "user", "content": "Fix the parser."}, {"role": "assistant", "content": "Done."}]
    messages.append({"role": "user", "content": text})
    return is_compaction_request(messages, (2,), extra)


class TestIsCompactionRequest:
    @pytest.mark.parametrize(
        "prompt",
        [
            CLAUDE_CODE,
            CLAUDE_CODE_WHOLE,
            CLAUDE_CODE_PARTIAL,
            CODEX,
            GEMINI_CLI,
            "Please summarise this conversation.",
            "Summarize the whole chat for me",
        ],
    )
    def test_the_major_clients_prompts_and_the_plain_request_are_recognised(self, prompt):
        assert asks(prompt)

    def test_a_prompt_in_text_parts_is_recognised(self):
        assert asks(
            [{"type": "text", "text": "<system-reminder>x</system-reminder>"}, {"type": "text", "text": CLAUDE_CODE}]
        )

    @pytest.mark.parametrize("prompt", ["Summarize this file.", "Fix the summary function.", "What did we decide?"])
    def test_ordinary_requests_are_not(self, prompt):
        assert not asks(prompt)

    def test_the_words_deep_inside_pasted_material_are_not_a_request(self):
        assert not asks("Review this log:\n" + "x" * 5000 + "\nsummarize the conversation")

    def test_only_the_latest_user_message_counts(self):
        messages = [{"role": "user", "content": CLAUDE_CODE}, {"role": "user", "content": "Go on."}]
        assert not is_compaction_request(messages, (1,))

    def test_an_operators_pattern_adds_to_the_built_in_ones(self):
        assert asks("Checkpoint the session now", (r"checkpoint the session",)) and not asks(
            "Checkpoint the session now"
        )

    def test_a_bad_pattern_is_an_error_naming_it(self):
        with pytest.raises(ValueError, match=r"\(unclosed"):
            compiled_patterns(("(unclosed",))

    def test_a_compaction_trigger_makes_a_request_one_whatever_its_text(self):
        """Codex's `compaction_trigger` item, and the end of a `/v1/responses/compact` request, carry no words."""
        messages = [{"role": "user", "content": "Fix the parser."}, {"role": "user", "content": "", TRIGGER: True}]
        assert is_compaction_request(messages, (1,)) and not is_compaction_request(messages[:1], (0,))
