"""Gemini through the guard with the official google-genai SDK (its edges: test_gemini_edges.py), as a new user would drive it: the
Developer API (`kind: gemini`, a key) and Vertex AI (`kind: vertex` configured as
examples/vertex-ai.yaml configures it, `vertexai=True`), each in front of a recording fake
provider (`tests.support.gemini_upstream`) whose count is its own."""

from __future__ import annotations

import base64
import io
import json
import struct
import zlib
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer
from google import genai
from google.genai import errors, types
from google.oauth2.credentials import Credentials

from proxy.config.settings import settings_from_dict
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.support.gemini_upstream import REPLY, FakeGemini, independent_count

FLASH = "gemini-2.5-flash"
WINDOW = 3000
RESERVE = 200
VERTEX_BASE = "{root}/v1/projects/my-project/locations/us-central1/endpoints/openapi"
WEATHER = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="get_weather",
            description="Weather for a city",
            parameters_json_schema={"type": "object", "properties": {"q": {"type": "string"}}},
        )
    ]
)


def lorem(n: int, word: str = "lorem") -> str:
    return " ".join([word] * n)


def conversation(turns: int) -> list[types.Content]:
    """`turns` question/answer pairs, a function call and its response in the middle, and a latest question."""
    contents: list[types.Content] = []
    for i in range(turns):
        contents.append(types.Content(role="user", parts=[types.Part(text=f"question {i} " + lorem(200))]))
        if i == turns // 2:
            call = types.Part(function_call=types.FunctionCall(name="get_weather", args={"q": "Paris"}, id="c1"))
            call.thought_signature = b"signed-call"
            contents.append(types.Content(role="model", parts=[call]))
            answer = types.FunctionResponse(name="get_weather", response={"sky": lorem(20, "sun")}, id="c1")
            contents.append(types.Content(role="user", parts=[types.Part(function_response=answer)]))
        contents.append(types.Content(role="model", parts=[types.Part(text=f"answer {i} " + lorem(200, "ipsum"))]))
    contents.append(types.Content(role="user", parts=[types.Part(text="And the latest question?")]))
    return contents


CONFIG = types.GenerateContentConfig(system_instruction="Answer briefly.", tools=[WEATHER], max_output_tokens=RESERVE)


@pytest.fixture
async def fake(aiohttp_server: Any) -> tuple[FakeGemini, str]:
    provider = FakeGemini()
    server = await aiohttp_server(provider.app())
    return provider, str(server.make_url("")).rstrip("/")


async def guard(aiohttp_server: Any, model_map: Any, upstream: dict[str, Any], env: dict[str, str]) -> str:
    data = {
        "upstreams": {"google": {"read_timeout": 10, "connect_timeout": 2, **upstream}},
        "models": {"overrides": [{"match": FLASH, "context_window": WINDOW}]},
    }
    settings = settings_from_dict(data, "test.yaml", env)
    server: TestServer = await aiohttp_server(create_app(settings, Models(settings, model_map)))
    return str(server.make_url("")).rstrip("/")


@pytest.fixture(params=["developer", "vertex"])
async def client(
    request: Any, fake: Any, aiohttp_server: Any, model_map: Any, monkeypatch: pytest.MonkeyPatch
) -> genai.Client:
    """google-genai pointed at the guard: with an API key in front of `kind: gemini`, or with
    vertexai=True in front of `kind: vertex` as examples/vertex-ai.yaml configures it."""
    _, root = fake
    if request.param == "developer":
        monkeypatch.setenv("GEMINI_KEY", "server-key")
        upstream = {"base_url": root, "kind": "gemini", "api_key_env": "GEMINI_KEY"}
        url = await guard(aiohttp_server, model_map, upstream, {})
        return genai.Client(api_key="client-key", http_options=types.HttpOptions(base_url=url))
    upstream = {"base_url": VERTEX_BASE.format(root=root), "kind": "vertex", "token_command": "printf vertex-token"}
    url = await guard(aiohttp_server, model_map, upstream, {})
    return genai.Client(
        vertexai=True,
        project="my-project",
        location="us-central1",
        credentials=Credentials(token="client-token"),
        http_options=types.HttpOptions(base_url=url),
    )


def png(width: int, height: int) -> bytes:
    """A real PNG of `width` x `height` (grey)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    out = io.BytesIO()
    out.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return out.getvalue()


def assert_within_budget_and_whole(sent: dict[str, Any]) -> None:
    """What reached the provider: within the budget by its own count, the system instruction and
    the latest turn as sent, and every function call with its response (both or neither)."""
    assert independent_count(sent) <= WINDOW - RESERVE
    assert sent["systemInstruction"]["parts"][0]["text"] == "Answer briefly."
    assert sent["contents"][-1]["parts"][0]["text"] == "And the latest question?"
    calls = [i for i, c in enumerate(sent["contents"]) if any("functionCall" in p for p in c["parts"])]
    answers = [i for i, c in enumerate(sent["contents"]) if any("functionResponse" in p for p in c["parts"])]
    assert [i + 1 for i in calls] == answers
    for i in calls:
        assert sent["contents"][i]["parts"][0]["thoughtSignature"] == base64.b64encode(b"signed-call").decode()


class TestConversationOverTheWindow:
    async def test_a_whole_request_reaches_the_provider_within_budget_and_the_sdk_reads_the_answer(
        self, fake: Any, client: genai.Client
    ) -> None:
        provider, _ = fake
        contents = conversation(8)
        assert (
            independent_count({"contents": [c.model_dump(mode="json", exclude_none=True) for c in contents]}) > WINDOW
        )
        reply = await client.aio.models.generate_content(model=FLASH, contents=contents, config=CONFIG)
        assert reply.text == REPLY
        (sent,) = provider.generated
        assert_within_budget_and_whole(sent.json())

    async def test_a_streamed_request_is_cut_the_same_and_streams_back(self, fake: Any, client: genai.Client) -> None:
        provider, _ = fake
        stream = await client.aio.models.generate_content_stream(model=FLASH, contents=conversation(8), config=CONFIG)
        texts = [chunk.text async for chunk in stream]
        assert "".join(t or "" for t in texts) == "Hello from Gemini."
        (sent,) = provider.generated
        assert ":streamGenerateContent" in sent.path and sent.query == "alt=sse"
        assert_within_budget_and_whole(sent.json())

    async def test_a_function_call_answered_now_goes_whole_with_its_signature(
        self, fake: Any, client: genai.Client
    ) -> None:
        provider, _ = fake
        provider.call_tool = "get_weather"
        contents = conversation(8)
        first = await client.aio.models.generate_content(model=FLASH, contents=contents, config=CONFIG)
        assert first.function_calls and first.function_calls[0].name == "get_weather"
        provider.call_tool = None
        answer = types.Part.from_function_response(name="get_weather", response={"sky": "clear"})
        contents += [first.candidates[0].content, types.Content(role="user", parts=[answer])]
        second = await client.aio.models.generate_content(model=FLASH, contents=contents, config=CONFIG)
        assert second.text == REPLY
        sent = provider.generated[-1].json()
        assert independent_count(sent) <= WINDOW - RESERVE
        assert sent["contents"][-2]["parts"][0] == {
            "functionCall": {"name": "get_weather", "args": {"q": "Paris"}},
            "thoughtSignature": "c2lnbmVk",
        }
        assert sent["contents"][-1]["parts"][0]["functionResponse"]["response"] == {"sky": "clear"}


class TestFittingRequests:
    async def test_a_fitting_request_arrives_byte_for_byte_with_the_configured_credential(
        self, fake: Any, aiohttp_server: Any, model_map: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        provider, root = fake
        monkeypatch.setenv("GEMINI_KEY", "server-key")
        upstream = {"base_url": root, "kind": "gemini", "api_key_env": "GEMINI_KEY"}
        url = await guard(aiohttp_server, model_map, upstream, {})
        raw = b'{"contents": [{"role": "user", "parts": [{"text": "hi"}]}],  "x-unknown": {"n": [1, 2.50]}}'
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{url}/v1beta/models/{FLASH}:generateContent?key=client-key",
                data=raw,
                headers={"Content-Type": "application/json", "x-goog-api-key": "client-key"},
            ) as response:
                assert response.status == 200
        (sent,) = provider.received
        assert sent.body == raw and sent.path == f"/v1beta/models/{FLASH}:generateContent"
        assert sent.headers["x-goog-api-key"] == "server-key" and "client-key" not in sent.query

    async def test_vertex_native_paths_go_to_the_host_never_under_the_openai_endpoint(
        self, fake: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        provider, root = fake
        upstream = {"base_url": VERTEX_BASE.format(root=root), "kind": "vertex", "token_command": "printf vertex-token"}
        url = await guard(aiohttp_server, model_map, upstream, {})
        client = genai.Client(
            vertexai=True,
            project="my-project",
            location="us-central1",
            credentials=Credentials(token="client-token"),
            http_options=types.HttpOptions(base_url=url),
        )
        reply = await client.aio.models.generate_content(model=FLASH, contents="hi")
        assert reply.text == REPLY
        (sent,) = provider.received
        path = f"/v1beta1/projects/my-project/locations/us-central1/publishers/google/models/{FLASH}:generateContent"
        assert sent.path == path and sent.headers["Authorization"] == "Bearer vertex-token"

    async def test_the_openai_compatible_endpoint_keeps_its_base_url(
        self, fake: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        provider, root = fake
        upstream = {"base_url": VERTEX_BASE.format(root=root), "kind": "vertex", "token_command": "printf vertex-token"}
        url = await guard(aiohttp_server, model_map, upstream, {})
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="client-key", max_retries=0)
        completion = await client.chat.completions.create(
            model="google/gemini-2.5-flash", messages=[{"role": "user", "content": "hi"}]
        )
        assert completion.choices[0].message.content == REPLY
        (sent,) = provider.received
        assert sent.path == "/v1/projects/my-project/locations/us-central1/endpoints/openapi/chat/completions"
        assert json.loads(sent.body)["model"] == "google/gemini-2.5-flash"

    async def test_gemini_s_json_array_stream_is_relayed_whole(
        self, fake: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        _, root = fake
        url = await guard(aiohttp_server, model_map, {"base_url": root, "kind": "gemini"}, {})
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1beta/models/{FLASH}:streamGenerateContent", json=body) as response:
                pieces = json.loads(await response.read())
        assert [p["candidates"][0]["content"]["parts"][0]["text"] for p in pieces] == ["Hello ", "from ", "Gemini."]


class TestRefusals:
    async def test_a_system_instruction_alone_over_the_window_is_a_client_error_and_nothing_is_sent(
        self, fake: Any, client: genai.Client
    ) -> None:
        provider, _ = fake
        config = types.GenerateContentConfig(system_instruction=lorem(4000))
        with pytest.raises(errors.ClientError) as raised:
            await client.aio.models.generate_content(model=FLASH, contents="hi", config=config)
        assert raised.value.code == 400 and raised.value.status == "INVALID_ARGUMENT"
        assert raised.value.message.startswith("The input token count (")
        assert "exceeds the maximum number of tokens allowed" in raised.value.message
        assert provider.generated == []

    @pytest.mark.parametrize(
        ("body", "field"),
        [
            ({"contents": {"role": "user"}}, "contents"),
            ({"contents": [{"role": "user", "parts": ["hi"]}]}, "contents[0].parts[0]"),
            ({"contents": [{"role": 7, "parts": [{"text": "hi"}]}]}, "contents[0].role"),
            ({"contents": [{"role": "user", "parts": [{"text": ["hi"]}]}]}, "contents[0].parts[0].text"),
        ],
    )
    async def test_bad_input_is_a_400_in_google_s_shape_naming_the_field(
        self, fake: Any, aiohttp_server: Any, model_map: Any, body: dict[str, Any], field: str
    ) -> None:
        provider, root = fake
        url = await guard(aiohttp_server, model_map, {"base_url": root, "kind": "gemini"}, {})
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1beta/models/{FLASH}:generateContent", json=body) as response:
                error = (await response.json())["error"]
        assert response.status == 400 and error["code"] == 400 and error["status"] == "INVALID_ARGUMENT"
        assert error["message"].startswith(f"{field}:")
        assert provider.received == []

    @pytest.mark.parametrize("model", ["gemini$pro", "..", "a%2540b"])
    async def test_a_model_name_that_is_not_plain_is_refused_before_anything_uses_it(
        self, fake: Any, aiohttp_server: Any, model_map: Any, model: str
    ) -> None:
        provider, root = fake
        url = await guard(aiohttp_server, model_map, {"base_url": root, "kind": "gemini"}, {})
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1beta/models/{model}:generateContent", json=body) as response:
                assert response.status in (400, 404)
        assert provider.received == []

    async def test_a_stream_the_provider_breaks_makes_the_sdk_raise(self, fake: Any, client: genai.Client) -> None:
        provider, _ = fake
        provider.break_stream_after = 1
        stream = await client.aio.models.generate_content_stream(model=FLASH, contents="hi")
        with pytest.raises(errors.APIError) as raised:
            async for _ in stream:
                pass
        assert raised.value.code == 502


class TestCounting:
    async def test_count_tokens_is_answered_by_the_guard(self, fake: Any, client: genai.Client) -> None:
        provider, _ = fake
        counted = await client.aio.models.count_tokens(model=FLASH, contents="hello there")
        assert counted.total_tokens is not None and 2 <= counted.total_tokens < 50
        assert provider.received == []

    async def test_images_are_counted_by_gemini_s_tiles(self, fake: Any, client: genai.Client) -> None:
        async def with_image(width: int, height: int) -> int:
            image = types.Part.from_bytes(data=png(width, height), mime_type="image/png")
            counted = await client.aio.models.count_tokens(model=FLASH, contents=[image, "what is it?"])
            assert counted.total_tokens is not None
            return counted.total_tokens

        counted = await client.aio.models.count_tokens(model=FLASH, contents=["what is it?"])
        text_only = counted.total_tokens or 0
        small, large = await with_image(300, 300), await with_image(1500, 700)
        assert small - text_only == 258  # both sides within 384 px: one image's worth
        assert large - text_only == 258 * 2  # 1500x700: two 768 px tiles across, one down


class TestSelfCorrection:
    async def test_gemini_s_overflow_sentence_from_the_provider_cuts_the_retry_to_its_limit(
        self, fake: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        provider, root = fake
        provider.limit = 1500  # the model serves less than the configured window
        url = await guard(aiohttp_server, model_map, {"base_url": root, "kind": "gemini"}, {})
        client = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=url))
        reply = await client.aio.models.generate_content(model=FLASH, contents=conversation(8), config=CONFIG)
        assert reply.text == REPLY
        first, retry = provider.generated
        assert independent_count(first.json()) > 1500 >= independent_count(retry.json())
