"""The answers every fake upstream gives (`proxy.demo.provider_answers`): a streamed answer spells what
the whole one says, in whichever pieces and with whichever details a test asks for, so a client
that accumulates the stream ends with the answer a test scripted."""

from __future__ import annotations

import base64
import json
import struct

import pytest

from proxy.demo.provider_answers import (
    ToolCall,
    Usage,
    anthropic_events,
    anthropic_message,
    chat_chunks,
    chat_completion,
    embedding_inputs,
    embeddings,
    event,
    frames,
    gemini_frames,
    gemini_response,
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

    def test_a_few_words_a_piece_join_to_the_text_too(self):
        assert words(TEXT, per=3) == ["the rain in ", "Spain"] and words("", per=8) == [""]


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


class TestStreamUsage:
    """What `stream_options.include_usage` asks for: a last chunk with no choices that carries the
    usage, and `"usage": null` on every chunk before it."""

    def test_chat_chunks_end_with_the_usage_of_the_whole_answer(self):
        chunks = [data for _, data in chat_chunks("m", TEXT, pieces=words(TEXT), framed=True, usage=Usage(7, 4))]
        assert (
            chunks[-1]["choices"] == []
            and chunks[-1]["usage"] == chat_completion("m", TEXT, usage=Usage(7, 4))["usage"]
        )
        assert all(chunk["usage"] is None for chunk in chunks[:-1])

    def test_text_completion_chunks_end_with_the_usage(self):
        chunks = [data for _, data in text_completion_chunks("m", words(TEXT), usage=Usage(7, 4))]
        assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 11

    def test_without_usage_no_chunk_names_it(self):
        assert not any("usage" in data for _, data in chat_chunks("m", TEXT, framed=True))


class TestEvent:
    def test_a_named_event_has_its_name_line_then_its_data_as_compact_json(self):
        assert event({"a": 1, "b": [2]}, "ping") == b'event: ping\ndata: {"a":1,"b":[2]}\n\n'

    def test_a_string_is_sent_as_it_is(self):
        assert event("[DONE]") == b"data: [DONE]\n\n" == frames([], done=True)[0]


class TestGemini:
    def test_a_piece_before_the_last_has_no_finish_reason(self):
        piece = gemini_response("g", "the ", finished=False)
        assert "finishReason" not in piece["candidates"][0] and piece["candidates"][0]["content"]["parts"] == [
            {"text": "the "}
        ]

    def test_parts_are_sent_as_they_are_and_usage_adds_up(self):
        call = {"functionCall": {"name": "f", "args": {}}}
        answer = gemini_response("g", [call], usage=Usage(5, 2), ids="r1")
        assert answer["candidates"][0]["content"]["parts"] == [call] and answer["responseId"] == "r1"
        assert answer["usageMetadata"] == {"promptTokenCount": 5, "candidatesTokenCount": 2, "totalTokenCount": 7}

    def test_a_stream_without_alt_sse_is_one_json_array(self):
        pieces = [gemini_response("g", word, finished=False) for word in words(TEXT)]
        assert json.loads(b"".join(gemini_frames(pieces, sse=False))) == pieces

    def test_a_stream_with_alt_sse_is_events_ended_by_crlf_pairs(self):
        pieces = [gemini_response("g", word) for word in words(TEXT)]
        frames_ = gemini_frames(pieces, sse=True)
        assert all(f.startswith(b"data: ") and f.endswith(b"\r\n\r\n") for f in frames_)
        assert [json.loads(f[6:]) for f in frames_] == pieces


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
        added = dict(events)["response.output_item.added"]["item"]
        assert added["content"] == [] and added["status"] == "in_progress"

    def test_part_events_say_the_response_is_in_progress_after_creating_it(self):
        events = response_events("m", response_item(TEXT), part_events=True, every_field=True)
        assert [name for name, _ in events][:2] == ["response.created", "response.in_progress"]
        assert events[1][1]["response"]["status"] == "in_progress" and events[1][1]["response"]["usage"] is None

    def test_a_response_repeats_the_request_fields_it_is_given(self):
        answer = response("m", [], instructions="be brief", parallel_tool_calls=False)
        assert answer["instructions"] == "be brief" and answer["parallel_tool_calls"] is False


class TestAnthropicEvents:
    def test_text_deltas_join_to_the_message_s_text(self):
        events = anthropic_events(anthropic_message("m", TEXT), pieces=words(TEXT))
        assert "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta") == TEXT

    def test_a_tool_s_input_streams_as_one_json_delta_of_the_whole_input(self):
        message = anthropic_message("m", CALL)
        (delta,) = [data["delta"] for name, data in anthropic_events(message) if name == "content_block_delta"]
        assert json.loads(delta["partial_json"]) == message["content"][0]["input"] == {"q": "rain"}
        assert anthropic_events(message)[-2][1]["delta"]["stop_reason"] == "tool_use"


class TestEmbeddings:
    def test_base64_vectors_decode_to_the_floats_given(self):
        answer = embeddings("m", [[0.5, -0.25], [1.0, 0.0]], tokens=3, as_base64=True)
        decoded = [struct.unpack("<2f", base64.b64decode(item["embedding"])) for item in answer["data"]]
        assert decoded == [(0.5, -0.25), (1.0, 0.0)] and answer["usage"] == {"prompt_tokens": 3, "total_tokens": 3}

    @pytest.mark.parametrize(
        ("value", "inputs"),
        [("a", ["a"]), ([1, 2], [[1, 2]]), (["a", [1]], ["a", [1]]), (5, None), ([], None), ([{"a": 1}], None)],
    )
    def test_an_input_is_one_text_one_token_list_or_a_list_of_either(self, value, inputs):
        assert embedding_inputs(value) == inputs
