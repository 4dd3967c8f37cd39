"""Counting a chat-completions body: pinned to the counts OpenAI's API reports."""

from __future__ import annotations

import io
import json
import zipfile

import pytest

from proxy.core.costs import media
from proxy.core.counting.count_cache import CountCache
from proxy.core.counting.count_rules import COMPONENTS
from proxy.core.counting.request_count import RequestCounter, definitions_hash
from tests.conftest import png_data_url
from tests.support.cookbook import COOKBOOK_MESSAGES, COOKBOOK_TOOL_MESSAGES, COOKBOOK_TOOLS


class TestCookbookCounts:
    @pytest.mark.parametrize(
        ("model", "expected"), [("gpt-3.5-turbo", 129), ("gpt-4", 129), ("gpt-4o", 124), ("gpt-4o-mini", 124)]
    )
    def test_messages_match_the_api_reported_prompt_tokens(self, counter_for, model, expected):
        assert counter_for(model).request({"messages": COOKBOOK_MESSAGES}).total == expected

    @pytest.mark.parametrize(
        ("model", "expected"), [("gpt-3.5-turbo", 105), ("gpt-4", 105), ("gpt-4o", 101), ("gpt-4o-mini", 101)]
    )
    def test_tools_match_the_api_reported_prompt_tokens(self, counter_for, model, expected):
        body = {"messages": COOKBOOK_TOOL_MESSAGES, "tools": COOKBOOK_TOOLS}
        assert counter_for(model).request(body).total == expected

    def test_legacy_functions_count_like_tools(self, counter_for):
        legacy = {"messages": COOKBOOK_TOOL_MESSAGES, "functions": [t["function"] for t in COOKBOOK_TOOLS]}
        assert counter_for("gpt-4o").request(legacy).total == 101


class TestBreakdown:
    def test_components_add_up_to_the_total(self, counter_for):
        body = {
            "messages": [
                {"role": "system", "content": "Be terse."},
                {"role": "user", "content": "Look at this", "name": "ana"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": '{"q": "weather"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21C"},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "and this?"},
                        {"type": "image_url", "image_url": {"url": png_data_url(512, 512)}},
                    ],
                },
            ],
            "tools": COOKBOOK_TOOLS,
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}},
            "documents": [{"title": "Rivers", "text": "Rivers flow to the sea."}],
        }
        count = counter_for("gpt-4o").request(body)
        assert sum(count.components.values()) == count.total
        assert sum(m.tokens for m in count.messages) + count.fixed_tokens == count.total
        assert set(count.components) == set(COMPONENTS)
        for component in COMPONENTS:  # this body has something of every kind
            assert count.components[component] > 0, component
        assert count.components["images"] == 85 + 170  # one 512x512 tile

    def test_latest_user_is_the_last_user_message(self, counter_for):
        body = {
            "messages": [
                {"role": "user", "content": "old question"},
                {"role": "assistant", "content": "old answer"},
                {"role": "user", "content": "new question"},
            ]
        }
        count = counter_for("gpt-4o").request(body)
        last = count.messages[2].tokens
        assert count.components["latest_user"] == last
        assert count.components["history"] == count.messages[0].tokens + count.messages[1].tokens

    def test_a_text_part_array_counts_like_the_same_text_as_a_string(self, counter_for):
        counter = counter_for("gpt-4o")
        as_string = counter.message({"role": "user", "content": "hello world"}, 0).tokens
        as_parts = counter.message({"role": "user", "content": [{"type": "text", "text": "hello world"}]}, 0).tokens
        assert as_parts == as_string

    def test_a_name_costs_its_tokens_and_one_more(self, counter_for):
        counter = counter_for("gpt-4o")
        plain = counter.message({"role": "user", "content": "hi"}, 0).tokens
        named = counter.message({"role": "user", "content": "hi", "name": "bob"}, 0).tokens
        assert named == plain + counter.text("bob") + 1


class TestToolCallsAndResults:
    def test_tool_calls_count_name_and_arguments(self, counter_for):
        counter = counter_for("gpt-4o")
        short = {
            "role": "assistant",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        }
        long_args = json.dumps({"query": "a much longer argument " * 20})
        long = {
            "role": "assistant",
            "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": long_args}}],
        }
        diff = counter.message(long, 0).tokens - counter.message(short, 0).tokens
        assert diff == counter.text(long_args) - counter.text("{}")

    def test_legacy_function_call_counts_like_one_tool_call(self, counter_for):
        counter = counter_for("gpt-4o")
        tool = counter.message(
            {
                "role": "assistant",
                "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            0,
        )
        legacy = counter.message({"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}}, 0)
        assert legacy.tokens == tool.tokens

    def test_tool_results_land_in_their_component(self, counter_for):
        body = {
            "messages": [
                {"role": "user", "content": "q"},
                {"role": "tool", "tool_call_id": "x", "content": "result text"},
            ]
        }
        count = counter_for("gpt-4o").request(body)
        assert count.components["tool_results"] == count.messages[1].tokens

    def test_reasoning_content_and_refusals_are_counted(self, counter_for):
        counter = counter_for("gpt-4o")
        plain = counter.message({"role": "assistant", "content": "ok"}, 0).tokens
        with_reasoning = counter.message(
            {"role": "assistant", "content": "ok", "reasoning_content": "let me think " * 10}, 0
        ).tokens
        assert with_reasoning == plain + counter.text("let me think " * 10)

    @pytest.mark.parametrize("field", ["reasoning_content", "refusal"])
    def test_a_text_field_is_counted_in_a_message_with_no_content(self, counter_for, field):
        counter = counter_for("gpt-4o")
        bare = counter.message({"role": "assistant"}, 0).tokens
        assert counter.message({"role": "assistant", field: "let me think " * 10}, 0).tokens == bare + counter.text(
            "let me think " * 10
        )

    @pytest.mark.parametrize(
        "field",
        [
            {"thinking_blocks": [{"type": "thinking", "thinking": "let me think " * 10, "signature": "s"}]},  # LiteLLM
            {"reasoning_details": [{"type": "reasoning.text", "text": "let me think " * 10}]},  # OpenRouter
        ],
    )
    def test_a_field_that_is_not_text_is_counted_as_its_json_and_said_to_be_a_bound(self, counter_for, field):
        counter = counter_for("gpt-4o")
        counted = counter.message({"role": "assistant", "content": "ok", **field}, 0)
        plain = counter.message({"role": "assistant", "content": "ok"}, 0).tokens
        (value,) = field.values()
        assert counted.tokens == plain + counter.text(json.dumps(value)) and "counted as its JSON" in counted.notes[0]

    def test_a_cache_marker_is_not_prompt_text(self, counter_for):
        counter = counter_for("gpt-4o")
        marked = counter.message({"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}}, 0)
        assert marked.tokens == counter.message({"role": "user", "content": "hi"}, 0).tokens and not marked.notes

    def test_an_earlier_audio_answer_sent_back_by_id_is_said_not_to_be_counted(self, counter_for):
        counted = counter_for("gpt-4o").message({"role": "assistant", "audio": {"id": "audio_abc123"}}, 0)
        assert "not counted" in counted.notes[0]


class TestToolDefinitions:
    def _count(self, counter, parameters):
        tools = [{"type": "function", "function": {"name": "f", "description": "Does f.", "parameters": parameters}}]
        return counter.request({"messages": [{"role": "user", "content": "x"}], "tools": tools}).components[
            "tool_definitions"
        ]

    def test_the_cached_count_of_the_same_tools_follows_the_system_message_they_join(self, registry, tokenizers):
        """The namespace joins the first system message (which gains a newline): the same tools
        cost differently with one and without one, cached or not."""
        profile = registry.profile("gpt-4o")
        tools = [{"type": "function", "function": {"name": "f", "description": "Does f.", "parameters": {}}}]
        alone = {"messages": [{"role": "user", "content": "x"}], "tools": tools}
        joined = {"messages": [{"role": "system", "content": "Be brief:"}, *alone["messages"]], "tools": tools}

        def tools_tokens(body, cache):
            counter = RequestCounter(profile, tokenizers.get(profile.tokenizer), cache)
            return counter.request(body).components["tool_definitions"]

        fresh = [tools_tokens(body, None) for body in (alone, joined)]
        cache = CountCache()
        assert fresh[0] != fresh[1]
        assert [tools_tokens(body, cache) for body in (joined, alone, joined)] == [fresh[1], fresh[0], fresh[1]]

    def test_the_cached_count_follows_the_definitions_whether_sent_as_the_same_objects_or_not(
        self, registry, tokenizers
    ):
        """A conversation re-sent hands its unchanged tools over as the objects read before; their
        hash is then not worked out again, but equal definitions in new objects and changed ones
        are keyed by what they say."""
        profile = registry.profile("gpt-4o")
        cache = CountCache()

        def tools_tokens(tools, cache=None):
            counter = RequestCounter(profile, tokenizers.get(profile.tokenizer), cache)
            body = {"messages": [{"role": "user", "content": "x"}], "tools": tools}
            return counter.request(body).components["tool_definitions"]

        def tools(description):
            return [{"type": "function", "function": {"name": "f", "description": description, "parameters": {}}}]

        short, long = tools("Does f."), tools("Does f, then g, then h, and says what each of them gave back.")
        uncached_short, uncached_long = tools_tokens(short), tools_tokens(long)
        assert uncached_short < uncached_long
        sent = [short, short, tools("Does f."), long, long, short]
        assert [tools_tokens(t, cache) for t in sent] == [uncached_short] * 3 + [uncached_long] * 2 + [uncached_short]
        assert definitions_hash((short, None)) == definitions_hash((tools("Does f."), None))
        assert definitions_hash((short, None)) != definitions_hash((long, None))

    def test_nested_objects_arrays_and_enums_all_add_tokens(self, counter_for):
        counter = counter_for("gpt-4o")
        flat = {"type": "object", "properties": {"a": {"type": "string"}}}
        nested = {
            "type": "object",
            "properties": {
                "a": {"type": "string"},
                "filter": {
                    "type": "object",
                    "properties": {
                        "tags": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]}},
                        "since": {"type": "string"},
                    },
                    "required": ["tags"],
                },
            },
        }
        assert self._count(counter, nested) > self._count(counter, flat) + counter.text(
            "red green blue since tags filter"
        )

    def test_a_forced_tool_choice_costs_tokens(self, counter_for):
        counter = counter_for("gpt-4o")
        base = {"messages": COOKBOOK_TOOL_MESSAGES, "tools": COOKBOOK_TOOLS}
        forced = {**base, "tool_choice": {"type": "function", "function": {"name": "get_current_weather"}}}
        assert counter.request(forced).total > counter.request(base).total

    def test_hosted_tools_without_a_schema_are_counted_from_their_json(self, counter_for):
        counter = counter_for("gpt-4o")
        body = {
            "messages": [{"role": "user", "content": "x"}],
            "tools": [{"type": "web_search_preview", "search_context_size": "high"}],
        }
        count = counter.request(body)
        assert count.components["tool_definitions"] > 0
        assert not count.exact


class TestResponseFormat:
    def test_a_json_schema_is_counted_and_grows_with_the_schema(self, counter_for):
        counter = counter_for("gpt-4o")
        small = {
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": {"type": "object", "properties": {"a": {"type": "string"}}}},
        }
        big_props = {f"field_{i}": {"type": "string", "description": f"The value of field {i}"} for i in range(20)}
        big = {
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": {"type": "object", "properties": big_props}},
        }
        body = {"messages": [{"role": "user", "content": "x"}]}
        small_n = counter.request({**body, "response_format": small}).components["response_format"]
        big_n = counter.request({**body, "response_format": big}).components["response_format"]
        assert small_n > 0
        assert big_n - small_n >= counter.text(json.dumps(big_props, separators=(",", ":"))) // 2


class TestEstimatesAreFlagged:
    def test_an_unknown_model_says_its_window_was_assumed(self, counter_for):
        count = counter_for("totally-unknown-model").request({"messages": [{"role": "user", "content": "hi"}]})
        assert not count.exact
        assert any("not in the model map" in note for note in count.notes)

    def test_a_scaled_tokenizer_says_it_is_an_estimate(self, counter_for):
        count = counter_for("claude-sonnet-4-5").request({"messages": [{"role": "user", "content": "hi"}]})
        assert not count.exact
        assert any("estimate" in note for note in count.notes)

    def test_non_object_parts_and_unknown_part_types_are_counted_not_ignored(self, counter_for):
        counter = counter_for("gpt-4o")
        m = counter.message({"role": "user", "content": [{"type": "mystery", "payload": "x" * 100}]}, 0)
        assert m.tokens > counter.text("x" * 100) // 2
        assert m.notes


class TestAudioAndFiles:
    def test_wav_audio_is_priced_by_its_duration(self, counter_for):
        import base64
        import struct

        rate = 16000 * 2  # 16 kHz mono 16-bit
        header = (
            b"RIFF"
            + struct.pack("<I", 36 + rate * 2)
            + b"WAVEfmt "
            + struct.pack("<IHHIIHH", 16, 1, 1, 16000, rate, 2, 16)
        )
        header += b"data" + struct.pack("<I", rate * 2)
        wav = base64.b64encode(header + b"\0" * (rate * 2)).decode()  # two seconds
        part = {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}
        m = counter_for("gpt-4o").message({"role": "user", "content": [part]}, 0)
        assert m.media_tokens == 64  # 2 s at 32 tokens/s

    def test_a_pdf_is_priced_per_page_and_flagged(self, counter_for):
        import base64

        pdf = (
            b"%PDF-1.4\n1 0 obj << /Type /Pages /Kids [2 0 R 3 0 R] /Count 2 >> endobj\n"
            b"2 0 obj << /Type /Page /Parent 1 0 R >> endobj\n3 0 obj << /Type /Page /Parent 1 0 R >> endobj\n"
            b"4 0 obj << /Type /Catalog /Pages 1 0 R >> endobj\ntrailer << /Root 4 0 R >>\n%%EOF"
        )
        part = {
            "type": "file",
            "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64," + base64.b64encode(pdf).decode()},
        }
        m = counter_for("gpt-4o").message({"role": "user", "content": [part]}, 0)
        assert m.media_tokens >= 2 * 85
        assert any("2 page" in n for n in m.notes)


def wav(seconds: int, stated_byte_rate: int) -> str:
    """Base64 of `seconds` of 16 kHz mono 16-bit PCM whose header states `stated_byte_rate`."""
    import base64
    import struct

    data = b"\0" * (32000 * seconds)
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, 16000, stated_byte_rate, 2, 16)
    head = (
        b"RIFF" + struct.pack("<I", 36 + len(data)) + b"WAVE" + b"fmt " + fmt + b"data" + struct.pack("<I", len(data))
    )
    return base64.b64encode(head + data).decode()


def pdf_part(pdf: bytes) -> dict:
    import base64

    return {
        "type": "file",
        "file": {"filename": "a.pdf", "file_data": "data:application/pdf;base64," + base64.b64encode(pdf).decode()},
    }


def object_stream_pdf(pages: int, text: bytes) -> bytes:
    """A PDF 1.5 file whose page objects sit in a compressed object stream, and whose one content
    stream (the text) is compressed too: no `/Type /Page` in its bytes as written."""
    import zlib

    objects = b" ".join(b"<< /Type /Page /Parent 2 0 R >>" for _ in range(pages))
    tree = b"<< /Type /Pages /Count %d >>" % pages
    packed = zlib.compress(tree + b" " + objects)
    content = zlib.compress(b"BT /F1 12 Tf (" + text + b") Tj ET")
    return (
        b"%PDF-1.5\n1 0 obj << /Type /ObjStm /N 2 /Filter /FlateDecode >>\nstream\n" + packed + b"\nendstream\n"
        b"9 0 obj << /Filter /FlateDecode >>\nstream\n" + content + b"\nendstream\n%%EOF"
    )


class TestDocuments:
    def test_vllm_s_documents_are_counted_as_their_json_and_said_to_be_a_bound(self, counter_for):
        """vLLM hands a chat body's `documents` to the model's template, which a retrieval
        model's renders into the prompt: a bound of any rendering is their JSON."""
        documents = [{"title": "Rivers", "text": "Rivers flow to the sea. " * 200}]
        counter = counter_for("gpt-4o")
        plain = counter.request({"messages": [{"role": "user", "content": "summarise"}]})
        count = counter.request({"messages": [{"role": "user", "content": "summarise"}], "documents": documents})
        as_json = counter.text(json.dumps(documents, separators=(",", ":")))
        assert count.components["documents"] == as_json == count.total - plain.total
        assert count.fixed_tokens == plain.fixed_tokens + as_json and not count.exact
        assert any(note.startswith("documents:") for note in count.notes)


class TestMediaBounds:
    def test_a_wav_header_with_a_wrong_byte_rate_is_read_by_its_sample_rate(self, counter_for):
        """Decoders play it by sample rate x block align: ten minutes are not one token."""
        part = {"type": "input_audio", "input_audio": {"data": wav(600, 0xFFFFFFFF), "format": "wav"}}
        tokens = counter_for("gpt-4o").message({"role": "user", "content": [part]}, 0).media_tokens
        assert 600 * 32 <= tokens <= 600 * 32 + 1  # base64's padding, read as bytes

    def test_a_pdf_s_pages_and_text_are_read_from_its_compressed_streams(self, counter_for):
        text = b"The quick brown fox jumps over the lazy dog. " * 2000
        pdf = object_stream_pdf(30, text)
        assert b"/Type /Page" not in pdf and len(pdf) < len(text) / 10
        counted = counter_for("gpt-4o").message({"role": "user", "content": [pdf_part(pdf)]}, 0)
        assert any("30 page(s)" in note for note in counted.notes)
        assert counted.media_tokens >= 30 * 85 + len(text) // 3

    def test_a_zipped_document_s_text_is_read_from_its_inflated_members(self, counter_for):
        """A docx is a ZIP of XML: its text is many times its compressed bytes."""
        text = b"<w:p><w:r><w:t>The quick brown fox jumps over the lazy dog.</w:t></w:r></w:p>" * 5000
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as docx:
            docx.writestr("[Content_Types].xml", b"<Types/>")
            docx.writestr("word/document.xml", text)
        raw = archive.getvalue()
        assert len(raw) < len(text) / 20
        counted = counter_for("gpt-4o").message({"role": "user", "content": [pdf_part(raw)]}, 0)
        assert counted.media_tokens >= len(text) // 3

    @pytest.mark.parametrize(
        ("members", "method"),
        [
            ({"a.xml": b"\0" * 3_000_000}, zipfile.ZIP_DEFLATED),  # inflates past the cap
            ({f"{i}.xml": b"x" for i in range(51)}, zipfile.ZIP_DEFLATED),  # more members than are read
            ({"a.xml": b"\0" * 1000}, zipfile.ZIP_BZIP2),  # bzip2 inflates a read whole: no bound but the cap
            ({"a.xml": b"\0" * 1000}, zipfile.ZIP_LZMA),
        ],
        ids=["past the cap", "too many members", "bzip2", "lzma"],
    )
    def test_a_zip_that_cannot_be_read_within_the_cap_is_counted_as_the_cap(
        self, counter_for, monkeypatch, members, method
    ):
        monkeypatch.setattr(media, "FILE_INFLATE_CAP", 1_000_000)
        monkeypatch.setattr(media, "ZIP_MEMBERS_READ", 50)
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w", method) as bomb:
            for name, content in members.items():
                bomb.writestr(name, content)
        counted = counter_for("gpt-4o").message({"role": "user", "content": [pdf_part(archive.getvalue())]}, 0)
        assert counted.media_tokens >= 1_000_000 // 3 and any("inflates past" in note for note in counted.notes)

    def test_a_member_with_a_wrong_checksum_still_counts_all_it_inflates_to(self, counter_for):
        """A provider that reads the text regardless sees all of it; the archive's own reader
        raises at the member's end, with its last bytes unreturned."""
        text = b"<w:t>The quick brown fox jumps over the lazy dog.</w:t>" * 5000
        archive = io.BytesIO()
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as docx:
            docx.writestr("word/document.xml", text)
        raw = bytearray(archive.getvalue())
        raw[14] ^= 0xFF  # the local header's CRC-32
        raw[raw.rfind(b"PK\x01\x02") + 16] ^= 0xFF  # and the central directory's
        counted = counter_for("gpt-4o").message({"role": "user", "content": [pdf_part(bytes(raw))]}, 0)
        assert counted.media_tokens >= len(text) // 3

    def test_streams_that_inflate_past_the_cap_are_counted_as_that_much(self, counter_for, monkeypatch):
        import zlib

        from proxy.core.costs import media

        monkeypatch.setattr(media, "FILE_INFLATE_CAP", 1_000_000)
        bomb = b"%PDF-1.5\n1 0 obj << /Filter /FlateDecode >>\nstream\n" + zlib.compress(b"\0" * 3_000_000)
        counted = counter_for("gpt-4o").message({"role": "user", "content": [pdf_part(bomb + b"\nendstream\n")]}, 0)
        assert counted.media_tokens >= 1_000_000 // 3 and any("inflates past" in note for note in counted.notes)


class TestAudioIsAnEstimate:
    def test_even_a_measured_wav_duration_makes_the_count_inexact(self, counter_for):
        import base64
        import struct

        rate = 16000 * 2
        header = (
            b"RIFF" + struct.pack("<I", 36 + rate) + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, rate, 2, 16)
        )
        wav = base64.b64encode(header + b"data" + struct.pack("<I", rate) + b"\0" * rate).decode()
        part = {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}
        count = counter_for("gpt-4o").request({"messages": [{"role": "user", "content": [part]}]})
        assert not count.exact
