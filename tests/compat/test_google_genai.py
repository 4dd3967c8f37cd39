"""Google's clients through the guard: google-genai with an API key (the Developer API's paths) and
with vertexai=True (Vertex AI's native paths), and langchain-google-genai: a long conversation
arrives within the window with its latest turn, the overflow is a ClientError in Google's words,
and a broken stream raises; google-genai's `interactions` (whole and streamed) are answered and
cut the same way."""

from __future__ import annotations

import pytest
from google import genai
from google.genai import errors, types
from google.oauth2.credentials import Credentials
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from tests.compat.conftest import GEMINI_MODEL, WINDOW, Servers
from tests.compat.conversations import HUGE, TURNS, tokens


def client(guard: Servers, mode: str) -> genai.Client:
    options = types.HttpOptions(base_url=guard.root)
    if mode == "developer":
        return genai.Client(api_key="gemini-compat", http_options=options)
    credentials = Credentials(token="vertex-compat")
    return genai.Client(
        vertexai=True, project="p", location="us-central1", credentials=credentials, http_options=options
    )


def history(turns: int = TURNS) -> list[types.Content]:
    contents = []
    for i in range(turns):
        contents.append(
            types.Content(role="user", parts=[types.Part(text=f"Question {i}: " + "why is the sky blue? " * 12)])
        )
        contents.append(
            types.Content(role="model", parts=[types.Part(text=f"Answer {i}: " + "because of scattering. " * 12)])
        )
    contents.append(types.Content(role="user", parts=[types.Part(text="And at sunset?")]))
    return contents


@pytest.mark.parametrize("mode", ["developer", "vertex"])
class TestGoogleGenai:
    @pytest.fixture
    def google(self, guard, mode):
        """The client, held for the test (google-genai closes its connections when it is collected)."""
        return client(guard, mode)

    def test_a_long_conversation_arrives_within_the_window_with_its_latest_turn(self, guard, google):
        reply = google.models.generate_content(model=GEMINI_MODEL, contents=history())
        arrived = guard.upstream.last
        assert reply.text == "ok" and arrived.path.endswith(f"models/{GEMINI_MODEL}:generateContent")
        assert tokens(arrived.body["contents"]) < WINDOW
        assert arrived.body["contents"][-1]["parts"][0]["text"] == "And at sunset?"
        assert guard.last_log()["outcome"] == "trimmed"

    def test_a_stream_is_cut_the_same_and_read_to_its_end(self, guard, google):
        guard.upstream.script.append("clear skies ahead")
        chunks = google.models.generate_content_stream(model=GEMINI_MODEL, contents=history())
        assert "".join(chunk.text or "" for chunk in chunks).split() == ["clear", "skies", "ahead"]
        assert tokens(guard.upstream.last.body["contents"]) < WINDOW

    def test_an_overflow_is_a_client_error_in_google_s_words(self, guard, google):
        config = types.GenerateContentConfig(system_instruction=HUGE)
        with pytest.raises(errors.ClientError) as caught:
            google.models.generate_content(model=GEMINI_MODEL, contents="hi", config=config)
        assert caught.value.code == 400 and caught.value.status == "INVALID_ARGUMENT"
        assert "exceeds the maximum number of tokens allowed" in caught.value.message
        assert not guard.upstream.received

    def test_a_stream_broken_mid_way_raises(self, guard, google):
        guard.upstream.script.append("one two three four five six")
        guard.upstream.break_after = 2
        with pytest.raises(errors.APIError):
            for _ in google.models.generate_content_stream(model=GEMINI_MODEL, contents="hi"):
                pass

    def test_a_long_interaction_arrives_within_the_window_with_its_latest_input(self, guard, google):
        kinds = {"user": "user_input", "model": "model_output"}
        steps = [{"type": kinds[c.role], "content": [{"type": "text", "text": c.parts[0].text}]} for c in history()]
        answer = google.interactions.create(model=GEMINI_MODEL, input=steps)
        arrived = guard.upstream.last
        assert answer.output_text == "ok" and arrived.path.endswith("/interactions")
        assert tokens(arrived.body["input"]) < WINDOW < tokens(steps)
        assert arrived.body["input"][-1]["content"][0]["text"] == "And at sunset?"
        assert guard.last_log()["outcome"] == "trimmed"

    def test_a_streamed_interaction_is_read_to_its_end(self, guard, google):
        guard.upstream.script.append("clear skies ahead")
        events = list(google.interactions.create(model=GEMINI_MODEL, input="And at sunset?", stream=True))
        text = "".join(e.delta.text for e in events if e.event_type == "step.delta")
        assert text.split() == ["clear", "skies", "ahead"] and events[-1].event_type == "interaction.completed"

    def test_count_tokens_is_answered_by_the_guard(self, guard, google):
        counted = google.models.count_tokens(model=GEMINI_MODEL, contents="how many tokens is this?")
        assert counted.total_tokens and counted.total_tokens > 3 and not guard.upstream.received


class TestLangchainGoogleGenai:
    def test_a_long_chat_arrives_trimmed_and_the_answer_comes_back(self, guard):
        # A compat-only library (the `compat` extra), imported here so that `make test` can collect
        # this module with the dev install alone.
        from langchain_google_genai import ChatGoogleGenerativeAI

        chat = ChatGoogleGenerativeAI(model=GEMINI_MODEL, google_api_key="gemini-compat", base_url=guard.root)
        messages = [SystemMessage("You are a weather agent.")]
        for i in range(TURNS):
            messages += [HumanMessage(f"Question {i}: " + "why? " * 40), AIMessage(f"Answer {i}: " + "because. " * 40)]
        messages.append(HumanMessage("And at sunset?"))
        reply = chat.invoke(messages)
        arrived = guard.upstream.last.body
        assert reply.content == "ok" and tokens(arrived["contents"]) < WINDOW
        assert arrived["contents"][-1]["parts"][0]["text"] == "And at sunset?"
        assert arrived["systemInstruction"]["parts"][0]["text"] == "You are a weather agent."
