"""Splitting a conversation: pinned, protected, and history turns with atomic tool units."""

from __future__ import annotations

from proxy.core.trimming.budget import protected_start
from proxy.core.trimming.turns import split_conversation, validity_problems
from tests.support.trimming import call, quick_split


def result(call_id: str) -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": "ok"}


SYSTEM = {"role": "system", "content": "s"}
U = {"role": "user", "content": "u"}
A = {"role": "assistant", "content": "a"}


class TestSplitConversation:
    def test_system_and_developer_messages_are_pinned_wherever_they_stand(self):
        messages = [SYSTEM, U, A, {"role": "developer", "content": "d"}, U]
        conversation = split_conversation(messages)
        assert conversation.pinned == (0, 3)
        assert 3 not in conversation.history

    def test_the_latest_user_message_and_what_follows_are_protected(self):
        messages = [SYSTEM, U, A, U, call("c1"), result("c1")]
        conversation = split_conversation(messages)
        assert conversation.protected == (3, 4, 5)
        assert conversation.history == (1, 2)

    def test_a_call_and_all_its_parallel_results_form_one_unit(self):
        messages = [U, call("a", "b"), result("a"), result("b"), A, U]
        (turn,) = split_conversation(messages).turns
        assert [u.indices for u in turn.units] == [(0,), (1, 2, 3), (4,)]
        assert turn.units[1].is_tool_exchange

    def test_turns_start_at_user_messages(self):
        messages = [SYSTEM, A, U, A, U, A, U]
        turns = split_conversation(messages).turns
        assert [t.indices for t in turns] == [(1,), (2, 3), (4, 5)]

    def test_a_call_whose_results_come_after_the_latest_user_message_is_protected_with_them(self):
        messages = [U, call("x"), U, result("x")]
        conversation = split_conversation(messages)
        assert conversation.protected == (1, 2, 3)

    def test_without_a_user_message_the_last_message_is_protected(self):
        conversation = split_conversation([SYSTEM, A, A])
        assert conversation.protected == (2,)


class TestProtectedStart:
    def test_without_a_tool_result_after_the_latest_user_message_it_is_where_the_full_split_protects(self):
        for messages in (
            [SYSTEM, U, A, U],
            [SYSTEM, U, call("a"), result("a"), A, {"role": "developer", "content": "d"}, U, A],
            [U, call("a", "b"), result("b"), result("a"), U],
            [A, SYSTEM, U],
        ):
            conversation = split_conversation(messages)
            assert quick_split(messages) == (conversation.pinned, conversation.protected)

    def test_a_tool_result_after_the_latest_user_message_needs_the_full_split(self):
        assert protected_start([U, call("x"), U, result("x")]) is None

    def test_a_conversation_without_a_user_message_needs_the_full_split(self):
        assert protected_start([SYSTEM, A, A]) is None



class TestValidityProblems:
    def test_a_valid_agent_conversation_has_none(self):
        assert validity_problems([SYSTEM, U, call("a", "b"), result("b"), result("a"), A, U]) == []

    def test_an_orphaned_tool_result_is_reported(self):
        assert "no preceding call" in validity_problems([U, result("zz")])[0]

    def test_a_call_without_all_its_results_is_reported(self):
        assert validity_problems([U, call("a", "b"), result("a"), U])

    def test_history_must_start_on_a_user_message(self):
        assert "starts with 'assistant'" in validity_problems([SYSTEM, A, U])[0]
