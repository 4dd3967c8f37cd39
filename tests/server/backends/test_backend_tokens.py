"""Counting with the backend's tokenizer: framing measured once, texts cached, a deadline, a fallback.

The backend here is a model of a ChatML server in plain Python: a token is a word, and each
message is `<|im_start|>role` content `<|im_end|>`; a conversation that does not begin with a
system message gets a default one, as SmolLM2's template does. Its text counts add a BOS token,
which the counter must take off.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from proxy.config.backends import BackendOptions
from proxy.core.counting.count_cache import CountCache
from proxy.core.counting.request_count import RequestCounter
from proxy.core.counting.tokenizer import CharEstimateTokenizer
from proxy.core.models.families import TEMPLATE_FORMAT
from proxy.core.models.framing import Framing
from proxy.core.models.model_registry import ModelRegistry
from proxy.server.backends.profiles import BackendDown
from proxy.server.backends.tokenize import BackendCounter, measure_framing
from tests.support.clock import ManualClock

DEFAULT_SYSTEM = "You are a helpful assistant named Chatty"


class ChatMlServer:
    def __init__(self, delay: float = 0.0, fail: bool = False, call_frame: int | None = None) -> None:
        self.delay = delay
        self.fail = fail  # every call answered without a count (as a 4xx would be)
        self.down = False  # every call fails as an unreachable server's does
        self.refused: set[str] = set()  # texts answered without a count
        self.call_frame = call_frame  # tokens around a tool call's name and arguments; None: calls dropped
        self.text_calls: list[str] = []
        self.conversation_calls = 0

    @staticmethod
    def words(text: str) -> int:
        return len(text.split())

    async def text(self, text: str) -> int | None:
        self.text_calls.append(text)
        await asyncio.sleep(self.delay)
        if self.down:
            raise BackendDown("connection refused")
        return None if self.fail or text in self.refused else 1 + self.words(text)  # a BOS on every text

    async def conversation(self, messages: list[dict[str, Any]]) -> int | None:
        self.conversation_calls += 1
        return None if self.fail else self.render(messages)

    def render(self, messages: list[dict[str, Any]]) -> int:
        if messages[0]["role"] != "system":
            messages = [{"role": "system", "content": DEFAULT_SYSTEM}, *messages]
        framed = sum(3 + self.words(m["content"]) for m in messages)  # <|im_start|> role ... <|im_end|>
        if self.call_frame is not None:
            for m in messages:
                for call in m.get("tool_calls", ()):
                    function = call["function"]
                    framed += self.call_frame + self.words(function["name"]) + self.words(function["arguments"])
        return 1 + framed + 2  # BOS, the messages, <|im_start|> assistant


@pytest.fixture
def profile() -> Any:
    return ModelRegistry({}).profile("some-local-model")


FALLBACK = CharEstimateTokenizer(1.0)  # one token per character: far from a word count, on purpose


def conversation(turns: int, system: bool = True) -> dict[str, Any]:
    messages = [{"role": "system", "content": "be brief and kind"}] if system else []
    for i in range(turns):
        messages.append({"role": "user", "content": f"question number {i} about the weather today"})
        messages.append({"role": "assistant", "content": f"answer {i} it is sunny"})
    messages.append({"role": "user", "content": "thanks"})
    return {"model": "some-local-model", "messages": messages}


async def count(counter: BackendCounter, body: dict[str, Any], profile: Any) -> tuple[int, Any]:
    prepared = await counter.prepare(body, profile, FALLBACK)
    return RequestCounter(prepared.profile, prepared.tokenizer).request(body).total, prepared


class TestMeasureFraming:
    async def test_measures_frames_priming_and_a_default_system_prompt(self):
        server = ChatMlServer()

        async def words(text: str) -> int:
            return server.words(text)

        framing = await measure_framing(server, words)
        assert framing is not None
        assert (framing.per_message, framing.reply_priming, framing.implicit_system) == (
            2,
            3,
            3 + server.words(DEFAULT_SYSTEM),
        )

    async def test_tells_a_template_that_drops_tool_calls_from_one_that_frames_them(self):
        async def words(text: str) -> int:
            return len(text.split())

        dropping = await measure_framing(ChatMlServer(), words)
        framing = await measure_framing(ChatMlServer(call_frame=5), words)
        assert dropping is not None and not dropping.renders_tool_calls
        assert framing == Framing(2, 3, 3 + len(DEFAULT_SYSTEM.split()), per_tool_call=5, tool_result_adjust=0)

    async def test_is_none_when_the_server_cannot_render(self):
        async def words(text: str) -> int:
            return len(text.split())

        assert await measure_framing(ChatMlServer(fail=True), words) is None


def with_tool_calls(body: dict[str, Any]) -> dict[str, Any]:
    messages = [*body["messages"][:-1]]
    call = {"id": "c1", "type": "function", "function": {"name": "look_up", "arguments": '{"city": "Oslo"}'}}
    messages += [
        {"role": "assistant", "content": "let me check", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny and mild"},
        body["messages"][-1],
    ]
    return {**body, "messages": messages}


class TestBackendCounter:
    @pytest.mark.parametrize("call_frame", [None, 4])
    async def test_counts_tool_calls_as_the_template_renders_them_or_not_at_all(self, profile, call_frame):
        server = ChatMlServer(call_frame=call_frame)
        counter = BackendCounter("local/model", server, CountCache())
        body = with_tool_calls(conversation(2))
        total, prepared = await count(counter, body, profile)
        # Where calls are rendered, the core keeps its margins around a call and counts the result's
        # call name too, though the template does not show it: a few tokens high, never low.
        slack = 0 if call_frame is None else 6
        assert server.render(body["messages"]) <= total <= server.render(body["messages"]) + slack
        assert prepared.remote

    @pytest.mark.parametrize("system", [True, False])
    async def test_counts_a_conversation_as_the_server_renders_it(self, profile, system):
        server = ChatMlServer()
        counter = BackendCounter("local/model", server, CountCache())
        body = conversation(3, system)
        total, prepared = await count(counter, body, profile)
        assert total == server.render(body["messages"])
        assert prepared.remote and prepared.tokenizer.exact

    @pytest.mark.parametrize("model", ["meta-llama/Llama-3.1-8B-Instruct", "qwen2.5-7b-instruct"])
    @pytest.mark.parametrize("system", [True, False])
    async def test_a_family_s_own_preamble_is_not_added_to_what_the_server_measured(self, model, system):
        """Llama 3.1's dated system preamble and Qwen's default system prompt are in the framing the
        server's own renderings gave: counted again, the count would be over the server's."""
        profile = ModelRegistry({}).profile(model)
        assert profile.chat_format.role_extra or profile.chat_format.default_system  # the family has one
        server = ChatMlServer()
        body = conversation(3, system)
        total, _ = await count(BackendCounter("local/model", server, CountCache()), body, profile)
        assert total == server.render(body["messages"])

    async def test_measures_the_framing_once(self, profile):
        server = ChatMlServer()
        counter = BackendCounter("local/model", server, CountCache())
        await count(counter, conversation(1), profile)
        await count(counter, conversation(2), profile)
        assert server.conversation_calls == 4

    async def test_a_resent_conversation_costs_only_its_new_texts(self, profile):
        server = ChatMlServer()
        counter = BackendCounter("local/model", server, CountCache())
        body = conversation(3)
        await count(counter, body, profile)
        server.text_calls.clear()
        body["messages"] += [{"role": "assistant", "content": "you are welcome"}, {"role": "user", "content": "bye now"}]
        total, prepared = await count(counter, body, profile)
        assert sorted(server.text_calls) == ["bye now", "you are welcome"]
        assert total == server.render(body["messages"]) and prepared.calls == 2

    async def test_a_slow_backend_leaves_the_rest_to_the_local_estimate_and_says_so(self, profile):
        server = ChatMlServer()
        counter = BackendCounter("local/model", server, CountCache(), BackendOptions(tokenize_timeout=0.05))
        await counter.framing()
        server.delay = 1.0
        total, prepared = await count(counter, conversation(2), profile)
        assert not prepared.remote and "counted locally" in prepared.note
        assert not prepared.tokenizer.exact
        assert total > server.render(conversation(2)["messages"])  # the estimate errs high here

    async def test_a_failing_backend_is_left_alone_for_a_while(self, profile):
        server = ChatMlServer(fail=True)
        clock = ManualClock(0.0)
        counter = BackendCounter("local/model", server, CountCache(), clock=clock)
        first = await counter.prepare(conversation(1), profile, FALLBACK)
        calls = len(server.text_calls)
        second = await counter.prepare(conversation(1), profile, FALLBACK)
        assert first.tokenizer is FALLBACK and second.tokenizer is FALLBACK
        assert len(server.text_calls) == calls  # not asked again during the cooldown
        server.fail, clock.now = False, 60.0
        assert (await counter.prepare(conversation(1), profile, FALLBACK)).remote

    async def test_a_backend_that_goes_down_is_left_alone_for_a_while(self, profile):
        server, clock = ChatMlServer(), ManualClock(0.0)
        counter = BackendCounter("local/model", server, CountCache(), clock=clock)
        await counter.framing()
        server.down = True
        assert not (await counter.prepare(conversation(2), profile, FALLBACK)).remote
        calls = len(server.text_calls)
        assert not (await counter.prepare(conversation(3), profile, FALLBACK)).remote
        assert len(server.text_calls) == calls  # not asked during the cooldown

    async def test_a_text_the_backend_refuses_is_counted_locally_and_the_backend_stays_in_use(self, profile):
        """One client's text (too long for the server's tokenize call, say) must not switch the
        backend's counting off for the requests of every other client."""
        server = ChatMlServer()
        counter = BackendCounter("local/model", server, CountCache())
        await counter.framing()
        refused = conversation(1)
        refused["messages"][1]["content"] = "a text this server will not tokenize"
        server.refused.add(refused["messages"][1]["content"])
        _, first = await count(counter, refused, profile)
        assert not first.remote and not first.tokenizer.exact and "counted locally" in first.note
        assert (await counter.prepare(conversation(2), profile, FALLBACK)).remote

    async def test_a_text_the_trim_makes_up_is_counted_locally_and_breaks_exactness(self, profile):
        counter = BackendCounter("local/model", ChatMlServer(), CountCache())
        prepared = await counter.prepare(conversation(1), profile, FALLBACK)
        assert prepared.tokenizer.count("a shortened text") == FALLBACK.count("a shortened text")
        assert not prepared.tokenizer.exact

    async def test_uses_the_measured_framing_not_the_template_upper_bound(self, profile):
        counter = BackendCounter("local/model", ChatMlServer(), CountCache())
        prepared = await counter.prepare(conversation(1), profile, FALLBACK)
        assert prepared.profile.chat_format.per_message == 2 != TEMPLATE_FORMAT.per_message

    async def test_completing_fetches_what_the_trim_made_up_so_a_recount_is_the_backend_s(self, profile):
        server = ChatMlServer()
        counter = BackendCounter("local/model", server, CountCache())
        prepared = await counter.prepare(conversation(1), profile, FALLBACK)
        prepared.tokenizer.count("a shortened text")
        calls = await counter.complete(prepared.tokenizer)
        assert calls == 1 and server.text_calls[-1] == "a shortened text"
        assert prepared.tokenizer.count("a shortened text") == 3 and prepared.tokenizer.exact

    async def test_completing_leaves_what_a_failing_backend_did_not_count_marked_as_local(self, profile):
        server = ChatMlServer()
        counter = BackendCounter("local/model", server, CountCache())
        prepared = await counter.prepare(conversation(1), profile, FALLBACK)
        prepared.tokenizer.count("a shortened text")
        server.fail = True
        await counter.complete(prepared.tokenizer)
        assert prepared.tokenizer.missing == {"a shortened text"} and not prepared.tokenizer.exact
