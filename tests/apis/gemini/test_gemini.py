"""Gemini's generateContent: turns of parts in, the chat view for the core, the cut written back
into the original JSON with every part it did not cut the very object the client sent."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from proxy.apis.base import HeldContext, InvalidRequest
from proxy.apis.gemini.generate_content import (
    CountTokensAdapter,
    GenerateContentAdapter,
    count_tokens_answer,
    gemini_error,
    model_name,
    overflow_sentence,
)
from proxy.apis.registry import AdapterRegistry, endpoint_api
from proxy.core.counting.request_count import RequestCounter
from proxy.core.learning.corrections import parse_overflow
from proxy.core.trimming.budget import Removal
from proxy.core.trimming.turns import split_conversation
from proxy.errors import HTTPRefusal
from tests.apis.fitting import fit_body, words
from tests.conftest import png_data_url
from tests.support.cookbook import encoding
from tests.support.trimming import profile, tokenizer

ADAPTER = GenerateContentAdapter()
CL100K = encoding("gpt-4")
SIGNED_CALL = {"functionCall": {"name": "read", "args": {"path": "a.py"}, "id": "c1"}, "thoughtSignature": "c2ln"}


def agent_body(turns: int = 6) -> dict[str, Any]:
    """A coding agent's conversation: old question/answer turns, a signed function call and its
    response, and the latest question."""
    contents: list[dict[str, Any]] = []
    for i in range(turns):
        contents.append({"role": "user", "parts": [{"text": f"question {i} " + words(300)}]})
        contents.append({"role": "model", "parts": [{"text": f"answer {i} " + words(300, "ipsum")}]})
    contents.append({"role": "model", "parts": [{"text": "Reading it.", "thought": True}, dict(SIGNED_CALL)]})
    contents.append({"role": "user", "parts": [{"functionResponse": {"name": "read", "id": "c1", "response": {}}}]})
    contents.append({"role": "user", "parts": [{"text": "Now run the tests."}]})
    return {
        "systemInstruction": {"parts": [{"text": "You are a coding agent."}]},
        "contents": contents,
        "tools": [{"functionDeclarations": [{"name": "read", "parametersJsonSchema": {"type": "object"}}]}],
        "generationConfig": {"maxOutputTokens": 500, "temperature": 0.2},
        "safetySettings": [],
    }


def texts_tokens(body: dict[str, Any]) -> int:
    """cl100k tokens of every text a body holds: an independent lower bound of any count of it."""
    parts = [p for c in body["contents"] for p in c["parts"]] + body["systemInstruction"]["parts"]
    return sum(len(CL100K.encode(p["text"])) for p in parts if isinstance(p.get("text"), str))


class TestParse:
    def test_the_system_instruction_is_pinned_and_each_turn_is_a_view_message(self) -> None:
        parsed = ADAPTER.parse(agent_body(1))
        roles = [m["role"] for m in parsed.messages]
        assert roles == ["system", "user", "assistant", "assistant", "tool", "user"]
        assert parsed.where(0) == "systemInstruction" and parsed.model is None

    def test_a_call_and_the_response_answering_it_are_one_unit_across_the_two_turns(self) -> None:
        parsed = ADAPTER.parse(agent_body(1))
        call, answer = parsed.messages[3], parsed.messages[4]
        assert call["tool_calls"][0]["id"] == answer["tool_call_id"] == "c1"
        assert call["reasoning_content"] == "Reading it."
        units = [u for t in split_conversation(parsed.messages).turns for u in t.units if u.is_tool_exchange]
        assert [u.indices for u in units] == [(3, 4)]

    def test_calls_without_ids_are_answered_by_name_then_in_order(self) -> None:
        body = {
            "contents": [
                {"role": "user", "parts": [{"text": "go"}]},
                {"role": "model", "parts": [{"functionCall": {"name": "a"}}, {"functionCall": {"name": "b"}}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "b"}}, {"functionResponse": {"name": "x"}}]},
            ]
        }
        messages = ADAPTER.parse(body).messages
        calls = [c["id"] for c in messages[1]["tool_calls"]]
        assert [m["tool_call_id"] for m in messages[2:]] == [calls[1], calls[0]]

    def test_a_signed_text_is_counted_but_never_shortened(self) -> None:
        body = {"contents": [{"role": "model", "parts": [{"text": "signed", "thoughtSignature": "c2ln"}]}]}
        (message,) = ADAPTER.parse(body).messages
        assert message["content"] == [{"type": "item", "item": {"text": "signed"}}]

    def test_inline_media_take_the_parts_their_published_rates_price(self) -> None:
        png = png_data_url(300, 300).split(",", 1)[1]
        parts = [
            {"inlineData": {"mimeType": "image/png", "data": png}},
            {"inlineData": {"mimeType": "audio/mp3", "data": "AAAA" * 1000}},
            {"inlineData": {"mimeType": "video/mp4", "data": "AAAA" * 1000}},
            {"inlineData": {"mimeType": "application/pdf", "data": "JVBERi0="}},
        ]
        parsed = ADAPTER.parse({"contents": [{"role": "user", "parts": parts}]})
        kinds = [p["type"] for p in parsed.messages[0]["content"]]
        assert kinds == ["image_url", "input_audio", "input_video", "file"]
        assert parsed.messages[0]["content"][2]["input_video"]["data"]  # its length is read from it by the count

    def test_files_by_uri_and_hosted_tools_are_flagged_as_not_seen(self) -> None:
        body = {
            "contents": [{"role": "user", "parts": [{"fileData": {"fileUri": "gs://b/f.pdf", "mimeType": "x"}}]}],
            "tools": [{"googleSearch": {}}, {"codeExecution": {}}],
        }
        parsed = AdapterRegistry().endpoint_for("/v1beta/models/gemini-2.5-pro:generateContent")
        assert parsed is not None
        unseen = parsed.parse(body).unseen
        assert any("googleSearch" in u for u in unseen) and any("file by id" in u for u in unseen)

    def test_cached_content_is_server_state(self) -> None:
        parsed = ADAPTER.parse({"contents": [], "cachedContent": "cachedContents/abc"})
        assert parsed.server_state and not parsed.read_whole
        assert parsed.held == (HeldContext("cache", "cachedContents/abc"),)

    def test_tools_tool_config_and_the_reserve_are_read(self) -> None:
        body = {
            "contents": [{"role": "user", "parts": [{"text": "hi"}]}],
            "tools": [{"functionDeclarations": [{"name": "f", "parameters": {"type": "OBJECT"}}]}],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY"}},
            "generationConfig": {"thinkingConfig": {"thinkingBudget": 1024}},
        }
        chat = ADAPTER.parse(body).chat
        assert chat["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "OBJECT"}}}]
        assert chat["tool_choice"] == body["toolConfig"] and chat["max_tokens"] == 1024

    def test_count_tokens_reads_a_wrapped_generate_content_request(self) -> None:
        inner = {"model": "models/gemini-2.5-pro", "contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        parsed = CountTokensAdapter().parse({"generateContentRequest": inner})
        assert parsed.messages == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
        assert count_tokens_answer(7) == {"totalTokens": 7}


class TestBadInput:
    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({"contents": "hi"}, "contents"),
            ({"contents": [{"parts": [{"text": "hi"}]}, "hi"]}, "contents[1]"),
            ({"contents": [{"role": ["user"], "parts": []}]}, "contents[0].role"),
            ({"contents": [{"role": "system", "parts": []}]}, "contents[0].role"),
            ({"contents": [{"role": "user", "parts": {"text": "hi"}}]}, "contents[0].parts"),
            ({"contents": [{"role": "user", "parts": [["hi"]]}]}, "contents[0].parts[0]"),
            ({"contents": [{"role": "user", "parts": [{"text": 1}]}]}, "contents[0].parts[0].text"),
            ({"contents": [], "systemInstruction": 3}, "systemInstruction"),
            ({"contents": [], "generationConfig": {"maxOutputTokens": 0}}, "generationConfig.maxOutputTokens"),
            ({"contents": [], "tools": [{"functionDeclarations": [{}]}]}, "tools[0].functionDeclarations[0]"),
        ],
    )
    def test_a_malformed_body_is_refused_naming_the_field(self, body: dict[str, Any], param: str) -> None:
        with pytest.raises(InvalidRequest) as refused:
            ADAPTER.parse(body)
        assert refused.value.param == param

    @pytest.mark.parametrize("name", ["a/b", "..", "a..b", "m?x", "m#x", "m x", "", "m%2F"])
    def test_a_model_in_the_path_must_be_a_plain_name(self, name: str) -> None:
        with pytest.raises(InvalidRequest):
            model_name(name)

    def test_plain_names_pass(self) -> None:
        assert model_name("gemini-2.5-pro@001") == "gemini-2.5-pro@001"


class TestRender:
    def test_a_request_that_fits_is_the_body_as_received(self) -> None:
        body = agent_body(1)
        fitted = fit_body(ADAPTER, body, 128_000)
        assert fitted.body is fitted.parsed.body and not fitted.changed

    def test_a_cut_keeps_the_system_instruction_the_latest_turn_and_the_call_with_its_response(self) -> None:
        body = agent_body(6)
        fitted = fit_body(ADAPTER, body, 2500)
        sent = fitted.body
        assert fitted.plan.result.outcome == "trimmed" and texts_tokens(dict(sent)) <= 2500 - 500
        assert sent["systemInstruction"] is body["systemInstruction"]
        assert sent["contents"][-1] is body["contents"][-1]
        assert sent["contents"][-3] is body["contents"][-3]  # the signed call, the very object sent
        assert sent["contents"][-3]["parts"][1]["thoughtSignature"] == "c2ln"
        assert sent["tools"] is body["tools"] and sent["safetySettings"] is body["safetySettings"]

    def test_kept_old_turns_are_the_objects_sent_or_shortened_only_in_their_text(self) -> None:
        body = agent_body(6)
        sent = fit_body(ADAPTER, body, 2500).body
        originals = {id(c) for c in body["contents"]}
        for content in sent["contents"]:
            if id(content) not in originals:
                assert content["role"] == "user" and all(set(p) == {"text"} for p in content["parts"])

    def test_a_lowered_reserve_is_written_into_the_generation_config(self) -> None:
        body = {
            "contents": [{"role": "user", "parts": [{"text": words(100)}]}],
            "generationConfig": {"maxOutputTokens": 60_000, "temperature": 0.5},
        }
        fitted = fit_body(ADAPTER, body, 10_000, pipeline=("clamp_max_tokens",))
        assert fitted.body["generationConfig"]["temperature"] == 0.5
        assert fitted.body["generationConfig"]["maxOutputTokens"] < 10_000


class TestGoogleLanguage:
    def test_errors_take_google_s_shape(self) -> None:
        assert gemini_error(400, "bad") == {"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}
        body = ADAPTER.error_body(HTTPRefusal("slow down", 429))
        assert body["error"]["status"] == "RESOURCE_EXHAUSTED"

    def test_the_overflow_sentence_is_one_the_self_correction_reads(self) -> None:
        error = gemini_error(400, overflow_sentence(2_769_478, 1_048_575))
        overflow = parse_overflow(400, str(error).replace("'", '"').encode())
        assert overflow is not None and overflow.limit == 1_048_575 and overflow.prompt_tokens == 2_769_478

    def test_a_broken_stream_ends_with_an_error_chunk_google_genai_raises_on(self) -> None:
        event = ADAPTER.broken_stream_event("upstream went away")
        assert event.startswith(b'data: {"error": {"code": 502') and event.endswith(b"\n\n")


class TestPaths:
    @pytest.mark.parametrize(
        ("path", "kind", "model", "stream"),
        [
            ("/v1beta/models/gemini-2.5-pro:generateContent", "generate_content", "gemini-2.5-pro", False),
            ("/v1/models/gemini-2.5-flash:streamGenerateContent", "generate_content", "gemini-2.5-flash", True),
            ("/v1beta/models/g:countTokens", "generate_content.count_tokens", "g", False),
            (
                "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro:generateContent",
                "generate_content",
                "gemini-2.5-pro",
                False,
            ),
            (
                "/v1/publishers/google/models/gemini-2.5-flash:generateContent",
                "generate_content",
                "gemini-2.5-flash",
                False,
            ),
            (
                "/v1beta1/projects/p/locations/global/publishers/google/models/m:streamGenerateContent",
                "generate_content",
                "m",
                True,
            ),
        ],
    )
    def test_gemini_paths_are_counted_with_the_model_the_path_names(
        self, path: str, kind: str, model: str, stream: bool
    ) -> None:
        endpoint = AdapterRegistry().endpoint_for(path)
        assert endpoint is not None and endpoint_api(endpoint) == kind
        assert endpoint.path_model == model and endpoint.stream is stream and endpoint.at_host_root

    def test_a_renamed_model_goes_into_the_path_as_its_last_component(self) -> None:
        endpoint = AdapterRegistry().endpoint_for("/v1beta/models/gemini-pro:generateContent")
        assert endpoint is not None
        segments = ("v1beta", "models", "gemini-pro:generateContent")
        assert endpoint.upstream_segments(segments, "google/gemini-2.5-pro")[-1] == "gemini-2.5-pro:generateContent"
        with pytest.raises(InvalidRequest):
            endpoint.upstream_segments(segments, "bad name")


class TestInsertedNote:
    def test_the_budget_note_opens_the_user_turn_after_the_dropped_ones(self) -> None:
        body = {
            "systemInstruction": {"parts": [{"text": "Be brief."}]},
            "contents": [
                {"role": "user", "parts": [{"text": "old question"}]},
                {"role": "model", "parts": [{"text": "old answer"}]},
                {"role": "user", "parts": [{"text": "latest"}]},
            ],
        }
        parsed = ADAPTER.parse(body)
        system, _, _, latest = parsed.messages
        note = {"role": "system", "content": "[2 earlier messages were removed to fit the context window]"}
        removals = [Removal(i, None, "dropped", 3, "h", "drop_oldest_turns") for i in (1, 2)]
        sent = ADAPTER.render(parsed, {"messages": [system, note, latest]}, removals, inserted=[1])
        assert sent["systemInstruction"] is body["systemInstruction"]
        assert sent["contents"] == [{"role": "user", "parts": [{"text": note["content"]}, {"text": "latest"}]}]


def image_tokens(model: str, body: dict[str, Any]) -> int:
    """What the images of a generateContent body cost for `model`, read through the adapter."""
    chat = ADAPTER.parse(body).chat
    return RequestCounter(profile(1_000_000, model), tokenizer(model)).request(chat).components["images"]


def image_body(part_level: object = None, request_level: str | None = None, size: int = 300) -> dict[str, Any]:
    image: dict[str, Any] = {"inlineData": {"mimeType": "image/png", "data": png_data_url(size, size).split(",")[1]}}
    if part_level is not None:
        image["mediaResolution"] = part_level
    body: dict[str, Any] = {"contents": [{"role": "user", "parts": [{"text": "What is it?"}, image]}]}
    if request_level is not None:
        body["generationConfig"] = {"mediaResolution": request_level}
    return body


# Google's "Media resolution" page, section "Token counts": Gemini 3's tokens per image.
GEMINI3_TABLE = [
    ("MEDIA_RESOLUTION_LOW", 280),
    ("MEDIA_RESOLUTION_MEDIUM", 560),
    ("MEDIA_RESOLUTION_HIGH", 1120),
    ("MEDIA_RESOLUTION_ULTRA_HIGH", 2240),
]


class TestGemini3ImageResolution:
    @pytest.mark.parametrize("model", ["gemini-3-pro-preview", "gemini-3-flash-preview", "gemini-3.1-pro-preview"])
    def test_an_image_with_no_resolution_asked_costs_the_default_high(self, model: str) -> None:
        assert image_tokens(model, image_body()) == 1120

    @pytest.mark.parametrize(("level", "tokens"), GEMINI3_TABLE)
    def test_the_request_s_resolution_prices_each_image(self, level: str, tokens: int) -> None:
        assert image_tokens("gemini-3-pro-preview", image_body(request_level=level)) == tokens

    @pytest.mark.parametrize(("level", "tokens"), GEMINI3_TABLE)
    def test_a_part_s_own_resolution_wins_over_the_request_s(self, level: str, tokens: int) -> None:
        body = image_body({"level": level}, request_level="MEDIA_RESOLUTION_LOW")
        assert image_tokens("gemini-3-flash-preview", body) == tokens

    def test_a_part_level_given_as_a_bare_string_is_read_too(self) -> None:
        assert image_tokens("gemini-3-pro-preview", image_body("MEDIA_RESOLUTION_MEDIUM")) == 560

    def test_a_part_asking_for_more_tokens_than_its_level_is_counted_at_what_it_asks(self) -> None:
        body = image_body({"level": "MEDIA_RESOLUTION_LOW", "numTokens": 4000})
        assert image_tokens("gemini-3-pro-preview", body) == 4000
        assert image_tokens("gemini-3-pro-preview", image_body({"numTokens": 64})) == 1120  # never below the level

    def test_a_level_the_table_does_not_know_is_priced_at_the_most_there_is(self) -> None:
        assert image_tokens("gemini-3-pro-preview", image_body(request_level="MEDIA_RESOLUTION_EXTREME")) == 2240

    def test_the_size_of_the_image_does_not_change_the_cost(self) -> None:
        assert image_tokens("gemini-3-pro-preview", image_body(size=3000)) == 1120


class TestGemini2ImagesUnchanged:
    @pytest.mark.parametrize("level", [None, "MEDIA_RESOLUTION_LOW", "MEDIA_RESOLUTION_HIGH"])
    def test_gemini_2_5_still_prices_images_by_258_token_tiles(self, level: str | None) -> None:
        assert image_tokens("gemini-2.5-flash", image_body(request_level=level)) == 258
        assert image_tokens("gemini-2.5-pro", image_body(request_level=level, size=1500)) == 258 * 4


class TestGemini3DocumentResolution:
    def test_each_pdf_page_costs_at_least_an_image_at_the_resolution_asked(self) -> None:
        """A PDF's pages are priced at the part's resolution, so a page read at ULTRA_HIGH is never
        counted at the default's: MEDIUM's 560 for a PDF (ai.google.dev, "Media resolution")."""
        pdf = base64.b64encode(b"%PDF-1.4\n1 0 obj << /Type /Page >> endobj\n2 0 obj << /Type /Page >> endobj\n")
        part: dict[str, Any] = {"inlineData": {"mimeType": "application/pdf", "data": pdf.decode()}}

        def documents(level: str | None) -> int:
            shown = {**part, "mediaResolution": {"level": level}} if level else part
            chat = ADAPTER.parse({"contents": [{"role": "user", "parts": [shown]}]}).chat
            counter = RequestCounter(profile(1_000_000, "gemini-3-pro-preview"), tokenizer("gemini-3-pro-preview"))
            return counter.request(chat).components["images"]

        assert documents("MEDIA_RESOLUTION_ULTRA_HIGH") - documents(None) == 2 * (2240 - 560)
        assert documents("MEDIA_RESOLUTION_LOW") - documents(None) == 2 * (280 - 560)
