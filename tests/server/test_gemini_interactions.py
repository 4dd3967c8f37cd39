"""Google's Interactions API through the guard with google-genai's `client.interactions`, as a new
user would drive it: the Developer API (`kind: gemini`, google-genai sends `/v1/interactions`)
and Vertex AI (`kind: vertex`, `vertexai=True` sends
`/v1beta1/projects/{p}/locations/{l}/interactions`), in front of the suite's fake Gemini, whose
count is its own."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from google import genai
from google.genai import types
from google.genai._interactions_errors import APIStatusError
from google.oauth2.credentials import Credentials

from proxy.config.settings import settings_from_dict
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.support.cookbook import encoding
from tests.support.gemini_upstream import REPLY, FakeGemini, interaction_texts

FLASH = "gemini-2.5-flash"
WINDOW = 3000
RESERVE = 200
VERTEX_BASE = "{root}/v1/projects/my-project/locations/us-central1/endpoints/openapi"
CL100K = encoding("gpt-4")


def their_count(body: dict[str, Any]) -> int:
    return sum(len(CL100K.encode(text, disallowed_special=())) for text in interaction_texts(body))


def lorem(n: int, word: str = "lorem") -> str:
    return " ".join([word] * n)


def steps(turns: int) -> list[dict[str, Any]]:
    """`turns` questions and answers, a function call and its result in the middle, then the latest question."""
    out: list[dict[str, Any]] = []
    for i in range(turns):
        out.append({"type": "user_input", "content": [{"type": "text", "text": f"question {i} " + lorem(200)}]})
        if i == turns // 2:
            out.append({"type": "function_call", "id": "c1", "name": "get_weather", "arguments": {"q": "Paris"}})
            out.append({"type": "function_result", "call_id": "c1", "name": "get_weather", "result": lorem(20, "sun")})
        out.append({"type": "model_output", "content": [{"type": "text", "text": f"answer {i} " + lorem(200, "ipsum")}]})
    out.append({"type": "user_input", "content": [{"type": "text", "text": "And the latest question?"}]})
    return out


@pytest.fixture
async def fake(aiohttp_server: Any) -> tuple[FakeGemini, str]:
    provider = FakeGemini()
    server = await aiohttp_server(provider.app())
    return provider, str(server.make_url("")).rstrip("/")


@pytest.fixture(params=["developer", "vertex"])
async def client(request: Any, fake: Any, aiohttp_server: Any, model_map: Any) -> genai.Client:
    """google-genai pointed at the guard: with a key in front of `kind: gemini`, or with
    vertexai=True in front of `kind: vertex`."""
    _, root = fake
    if request.param == "developer":
        upstream = {"base_url": root, "kind": "gemini", "api_key_env": "GEMINI_KEY"}
    else:
        upstream = {"base_url": VERTEX_BASE.format(root=root), "kind": "vertex", "token_command": "printf vertex-token"}
    data = {
        "upstreams": {"google": {"read_timeout": 10, "connect_timeout": 2, **upstream}},
        "models": {"overrides": [{"match": FLASH, "context_window": WINDOW}]},
    }
    settings = settings_from_dict(data, "test.yaml", {"GEMINI_KEY": "server-key"})
    server: TestServer = await aiohttp_server(create_app(settings, Models(settings, model_map)))
    options = types.HttpOptions(base_url=str(server.make_url("")).rstrip("/"))
    if request.param == "developer":
        return genai.Client(api_key="client-key", http_options=options)
    credentials = Credentials(token="client-token")
    return genai.Client(vertexai=True, project="my-project", location="us-central1", credentials=credentials,
                        http_options=options)  # fmt: skip


class TestInteractionsThroughTheGuard:
    async def test_an_interaction_is_answered_and_reaches_the_provider_as_sent(self, client, fake):
        """A short interaction fits: the provider receives the body as google-genai wrote it, on its own path."""
        provider, _ = fake
        answer = await client.aio.interactions.create(model=FLASH, input="Hello?", system_instruction="Be brief.")
        assert answer.output_text == REPLY
        sent = provider.received[-1]
        assert sent.path.endswith("/interactions") and sent.json()["input"] == "Hello?"
        assert sent.path in ("/v1/interactions", "/v1beta1/projects/my-project/locations/us-central1/interactions")

    async def test_a_long_interaction_is_cut_to_the_budget_keeping_the_latest_input_and_whole_calls(self, client, fake):
        provider, _ = fake
        answer = await client.aio.interactions.create(
            model=FLASH, input=steps(8), system_instruction="Answer briefly.",
            generation_config={"max_output_tokens": RESERVE},
        )  # fmt: skip
        assert answer.output_text == REPLY
        sent = provider.received[-1].json()
        assert their_count({"input": steps(8)}) > WINDOW  # it did not fit as written
        assert their_count(sent) <= WINDOW - RESERVE
        assert sent["input"][-1]["content"][0]["text"] == "And the latest question?"
        kinds = [step["type"] for step in sent["input"]]
        assert kinds.count("function_call") == kinds.count("function_result")
        assert sent["system_instruction"] == "Answer briefly." and sent["generation_config"]["max_output_tokens"] == RESERVE

    async def test_a_streamed_interaction_is_relayed_event_by_event(self, client, fake):
        stream = await client.aio.interactions.create(model=FLASH, input="Hello?", stream=True)
        kinds, text = [], ""
        async for event in stream:
            kinds.append(event.event_type)
            if event.event_type == "step.delta":
                text += event.delta.text
        assert text == REPLY
        assert kinds[0] == "interaction.created" and kinds[-1] == "interaction.completed"

    async def test_a_system_instruction_alone_over_the_window_is_refused_in_the_apis_own_words(self, client, fake):
        provider, _ = fake
        with pytest.raises(APIStatusError) as refused:
            await client.aio.interactions.create(model=FLASH, input="hi", system_instruction=lorem(4000))
        assert refused.value.status_code == 400
        assert refused.value.body["error"]["code"] == "invalid_request"
        message = refused.value.body["error"]["message"]
        assert message.startswith("The input token count (") and "exceeds the maximum number of tokens allowed" in message
        assert not [r for r in provider.received if r.path.endswith("/interactions")]

    async def test_a_chained_interaction_names_the_earlier_one_and_is_forwarded_with_store_untouched(
        self, client, fake
    ):
        provider, _ = fake
        await client.aio.interactions.create(model=FLASH, input="And then?", previous_interaction_id="int_1")
        sent = provider.received[-1].json()
        assert sent["previous_interaction_id"] == "int_1" and "store" not in sent

    async def test_a_chain_is_counted_with_what_the_earlier_interaction_holds_and_never_sent_over(
        self, client, fake
    ):
        """The first interaction's answer says what it holds (its input and output); the next one
        naming it is counted as that plus what it sends: sent alone it would fit, with the chain it
        does not, so its own steps are cut (or it is refused) and the provider never reads more
        than the window."""
        provider, _ = fake
        first = await client.aio.interactions.create(
            model=FLASH, input=steps(3), generation_config={"max_output_tokens": RESERVE}
        )
        held = their_count({"input": steps(3)}) + 3  # the fake's usage: its own count of the input, 3 out
        assert held < WINDOW - RESERVE  # the first one fitted whole
        before = len(provider.received)
        try:
            await client.aio.interactions.create(
                model=FLASH, input=steps(4), previous_interaction_id=first.id,
                generation_config={"max_output_tokens": RESERVE},
            )  # fmt: skip
        except APIStatusError as refused:  # nothing of its own left to cut: refused before sending
            assert refused.value.status_code == 400 and len(provider.received) == before
            return
        sent = provider.received[-1].json()
        assert sent["previous_interaction_id"] == first.id
        assert held + their_count(sent) <= WINDOW - RESERVE
        assert held + their_count({"input": steps(4)}) > WINDOW - RESERVE  # it did not fit with the chain
        assert their_count({"input": steps(4)}) > their_count(sent)  # so its own steps were cut

    async def test_a_stream_the_provider_breaks_ends_with_the_apis_own_error_event(self, client, fake):
        provider, _ = fake
        provider.break_stream_after = 3
        stream = await client.aio.interactions.create(model=FLASH, input="Hello?", stream=True)
        events = [event async for event in stream]
        assert events[-1].event_type == "error" and events[-1].error.code == "unavailable"
        assert "interaction.completed" not in [event.event_type for event in events]

    async def test_the_provider_s_overflow_is_read_and_the_interaction_sent_again_within_its_limit(self, client, fake):
        """The provider's window is smaller than the guard was told: its refusal (Gemini's sentence
        in the Interactions shape) teaches the guard, which cuts and sends once more."""
        provider, _ = fake
        provider.limit = 1200
        assert their_count({"input": steps(4)}) > 1200
        answer = await client.aio.interactions.create(model=FLASH, input=steps(4))
        sent = [r.json() for r in provider.received if r.path.endswith("/interactions")]
        assert answer.output_text == REPLY and len(sent) == 2
        assert their_count(sent[-1]) <= 1200 and sent[-1]["input"][-1] == steps(4)[-1]
