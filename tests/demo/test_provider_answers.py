"""The answers every fake upstream gives (`proxy.demo.provider_answers`): a streamed answer spells what
the whole one says, in whichever pieces and with whichever details a test asks for, so a client
that accumulates the stream ends with the answer a test scripted."""

from __future__ import annotations

import json

import pytest

from proxy.demo.provider_answers import (
    ToolCall,
    anthropic_events,
    anthropic_message,
    chat_chunks,
    chat_completion,
    response,
    response_events,
    response_item,
    text_completion,
    text_completion_chunks,
    words,
)

TEXT = "the rain in Spain"
CALL = ToolCall("lookup", '{"q": "rain"}')


class TestWords:
    def test_pieces_keep_their_spaces_and_join_to_the_text(self):
        assert words(TEXT) == ["the ", "rain ", "in ", "Spain"]


class TestChatChunks:
    @pytest.mark.parametrize("pieces", [None, words(TEXT)])
    def test_the_deltas_join_to_the_whole_answer_s_content(self, pieces):
        chunks = chat_chunks("m", TEXT, pieces=pieces, framed=True)
        deltas = "".join(data["choices"][0]["delta"].get("content", "") for _, data in chunks)
        assert deltas == chat_completion("m", TEXT)["choices"][0]["message"]["content"]

    def test_framed_chunks_open_with_the_role_and_close_with_the_whole_answer_s_finish_reason(self):
        chunks = [data["choices"][0] for _, data in chat_chunks("m", CALL, framed=True, logprobs=True)]
        assert chunks[0]["delta"] == {"role": "assistant", "content": ""}
        assert chunks[1]["delta"]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": CALL.arguments}
        assert chunks[-1]["finish_reason"] == chat_completion("m", CALL)["choices"][0]["finish_reason"] == "tool_calls"
        assert all(chunk["logprobs"] is None for chunk in chunks)


class TestTextCompletionChunks:
    def test_the_pieces_join_to_the_whole_completion_s_text_and_the_last_says_stop(self):
        choices = [data["choices"][0] for _, data in text_completion_chunks("m", words(TEXT))]
        assert "".join(c["text"] for c in choices) == text_completion("m", TEXT)["choices"][0]["text"]
        assert [c["finish_reason"] for c in choices][-2:] == [None, "stop"]


class TestResponseEvents:
    @pytest.mark.parametrize("part_events", [False, True])
    @pytest.mark.parametrize("answer", [TEXT, CALL])
    def test_the_stream_completes_with_the_whole_response_numbered_from_zero(self, answer, part_events):
        item = response_item(answer, ids="7")
        fields = {"ids": "7", "every_field": True, "previous_response_id": "resp_6"}
        events = response_events("m", item, pieces=words(TEXT), part_events=part_events, **fields)
        assert events[-1][1]["response"] == response("m", [item], **fields)
        assert (
            events[0][1]["response"]["usage"] is None and events[0][1]["response"]["previous_response_id"] == "resp_6"
        )
        assert [data["sequence_number"] for _, data in events] == list(range(len(events)))
        assert all(name == data["type"] for name, data in events)

    def test_text_deltas_join_to_the_item_s_text_and_part_events_surround_them(self):
        events = response_events("m", response_item(TEXT), pieces=words(TEXT), part_events=True)
        names = [name for name, _ in events]
        deltas = [data["delta"] for name, data in events if name == "response.output_text.delta"]
        assert "".join(deltas) == TEXT
        assert names.index("response.content_part.added") < names.index("response.output_text.delta")
        assert names.index("response.output_text.done") < names.index("response.content_part.done")
        assert events[1][1]["item"]["content"] == []


class TestAnthropicEvents:
    def test_text_deltas_join_to_the_message_s_text(self):
        events = anthropic_events(anthropic_message("m", TEXT), pieces=words(TEXT))
        assert "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta") == TEXT

    def test_a_tool_s_input_streams_as_one_json_delta_of_the_whole_input(self):
        message = anthropic_message("m", CALL)
        (delta,) = [data["delta"] for name, data in anthropic_events(message) if name == "content_block_delta"]
        assert json.loads(delta["partial_json"]) == message["content"][0]["input"] == {"q": "rain"}
        assert anthropic_events(message)[-2][1]["delta"]["stop_reason"] == "tool_use"
