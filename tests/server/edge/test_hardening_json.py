"""Ambiguous or ill-typed JSON gets an OpenAI-shaped 400 naming the field, never a 500 or a guess."""

from __future__ import annotations

import json
import time

import orjson
import pytest

from proxy.apis.openai.chat import check_chat_body
from proxy.core.plan import InvalidBody
from proxy.wire.codec import AmbiguousJson, JsonLimits, loads_strict
from proxy.wire.readers import read_chat_body
from tests.server.raw_http import raw_request

JSON = {"Content-Type": "application/json"}
HI = [{"role": "user", "content": "hi"}]


def chat(**fields: object) -> dict[str, object]:
    return {"model": "gpt-4o", "messages": HI, **fields}


class TestDuplicateKeys:
    @pytest.mark.parametrize(
        ("raw", "key"),
        [
            (b'{"model": "gpt-4o", "messages": [], "messages": [{"role": "user", "content": "hi"}]}', "messages"),
            (b'{"model":"a","model":"b","messages":[{"role":"user","content":"hi"}]}', "model"),
            (b'{"model":"a","messages":[{"role":"user","content":"x","content":"y"}]}', "content"),
            (b'{"model":"a","messages":[{"role":"user","role":"system","content":"x"}]}', "role"),
            (b'{"model" : "a", "model" : "b"}', "model"),
            (b'{"m\\u006fdel":"a","model":"b"}', "model"),
            (b'{"model\\\\":"a","model\\\\":"b"}', "model\\"),
            (b'{"a":"\\":","a":1}', "a"),
            (b'{"n":123456789012345678901234567890,"n":1}', "n"),
        ],
    )
    def test_a_key_written_twice_is_refused_by_name(self, raw, key):
        with pytest.raises(AmbiguousJson) as caught:
            loads_strict(raw)
        assert caught.value.param == key

    def test_escaped_quotes_inside_strings_are_not_keys(self):
        body = {"model": "m", "messages": [{"role": "tool", "content": json.dumps({"a": 1, "b": {"a": 2}})}]}
        raw = json.dumps(body).encode()
        assert loads_strict(raw) == body

    def test_the_check_costs_little_on_a_1_mb_body(self):
        messages = [{"role": "user", "content": "words " * 100, "name": f"u{i}"} for i in range(1600)]
        raw = orjson.dumps({"model": "gpt-4o", "messages": messages})
        assert len(raw) > 1_000_000

        def best_of(parse: object, rounds: int = 5) -> float:
            times = []
            for _ in range(rounds):
                started = time.thread_time()  # this thread's CPU: what other processes do is not counted
                parse(raw)  # type: ignore[operator]
                times.append(time.thread_time() - started)
            return min(times)

        # Against the standard library's parse of the same body, in this thread's CPU (the best of five):
        # the strict parse may cost a few of those, never an order of magnitude more.
        assert best_of(loads_strict) < 4 * best_of(json.loads) + 0.02


class TestNestingAndSurrogates:
    def test_nesting_past_the_limit_is_refused(self):
        with pytest.raises(AmbiguousJson, match="deeper than 8"):
            loads_strict(b'{"a":' * 9 + b"1" + b"}" * 9, JsonLimits(max_depth=8))
        assert loads_strict(b'{"a":' * 8 + b"1" + b"}" * 8, JsonLimits(max_depth=8))

    def test_nesting_past_the_interpreter_s_recursion_limit_is_a_value_error(self):
        with pytest.raises(ValueError, match="nests"):
            loads_strict(b"[" * 100_000 + b"NaN" + b"]" * 100_000)

    @pytest.mark.parametrize("raw", [b'["\\ud800"]', b'{"\\udfff": 1}', b'["a\\udc00b", NaN]'])
    def test_a_lone_surrogate_is_refused(self, raw):
        with pytest.raises(AmbiguousJson, match="surrogate"):
            loads_strict(raw)

    def test_a_surrogate_pair_is_an_ordinary_character(self):
        assert loads_strict(b'["\\ud83d\\ude00"]') == ["\U0001f600"]

    @pytest.mark.parametrize("depth", [1, 201, "64"])
    def test_a_bad_depth_limit_is_a_value_error(self, depth):
        with pytest.raises(ValueError, match="max_json_depth"):
            JsonLimits(max_depth=depth)


class TestChatBodyTypes:
    @pytest.mark.parametrize(
        ("body", "param"),
        [
            (chat(tools=5), "tools"),
            (chat(tools=[5]), "tools[0]"),
            (chat(tools=[{"type": "function", "function": {"name": 5}}]), "tools[0].function.name"),
            (chat(tool_choice={"function": 5}), "tool_choice.function"),
            (chat(tool_choice={"type": "function", "function": {"name": ["f"]}}), "tool_choice.function.name"),
            (chat(max_tokens=10**23), "max_tokens"),
            (chat(max_completion_tokens=-1), "max_completion_tokens"),
            (chat(max_tokens=1.5), "max_tokens"),
            (chat(max_tokens=True), "max_tokens"),
            (chat(response_format="json"), "response_format"),
            (chat(functions={"name": "f"}), "functions"),
            (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
            (chat(messages=[{"role": "user", "content": [5]}]), "messages[0].content[0]"),
            (
                chat(messages=[{"role": "user", "content": [{"type": "text", "text": {}}]}]),
                "messages[0].content[0].text",
            ),
            (
                chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": 1}}]}]),
                "messages[0].content[0].image_url.url",
            ),
            (chat(messages=[{"role": "tool", "tool_call_id": {}, "content": "x"}]), "messages[0].tool_call_id"),
            (chat(messages=[{"role": "assistant", "tool_calls": {"id": "x"}}]), "messages[0].tool_calls"),
            (
                chat(messages=[{"role": "assistant", "tool_calls": [{"function": {"arguments": {}}}]}]),
                "messages[0].tool_calls[0].function.arguments",
            ),
            (chat(messages=[{"role": "user", "content": "x", "name": 7}]), "messages[0].name"),
            (chat(model=""), "model"),
        ],
    )
    def test_a_field_the_core_reads_of_the_wrong_type_is_named(self, body, param):
        with pytest.raises(InvalidBody) as caught:
            check_chat_body(body)
        assert caught.value.param == param and "\n" not in str(caught.value)

    def test_null_and_unknown_fields_pass(self):
        body = chat(tools=None, max_tokens=None, metadata={"tools": 5}, seed=10**30, stream=True)
        assert check_chat_body(body) is body

    def test_a_schema_with_a_list_of_types_is_counted(self, counter_for):
        tool = {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {"q": {"type": ["string", "null"]}},
                    "required": [{}],
                    "$defs": [],
                },
            },
        }
        body = read_chat_body(json.dumps(chat(tools=[tool])).encode())
        assert counter_for("gpt-4o").request(body).total > 0


class TestOverSockets:
    @pytest.mark.parametrize(
        ("raw", "param", "fragment"),
        [
            (
                b'{"model": "gpt-4o", "messages": [], "messages": [{"role": "user", "content": "hi"}]}',
                "messages",
                "'messages' twice",
            ),
            (json.dumps(chat(tools=5)).encode(), "tools", "tools must be an array"),
            (json.dumps(chat(tool_choice={"function": 5})).encode(), "tool_choice.function", "must be an object"),
            (
                b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 100000000000000000000000}',
                "max_tokens",
                "whole number",
            ),
            (b'{"model": "\\ud800", "messages": [{"role": "user", "content": "hi"}]}', None, "surrogate"),
            (
                json.dumps(
                    chat(
                        extra=[
                            [
                                [
                                    [
                                        [
                                            [
                                                [
                                                    [
                                                        [
                                                            [
                                                                [
                                                                    [
                                                                        [
                                                                            [
                                                                                [
                                                                                    [
                                                                                        [
                                                                                            [
                                                                                                [
                                                                                                    [
                                                                                                        [
                                                                                                            [
                                                                                                                [
                                                                                                                    [
                                                                                                                        [
                                                                                                                            [
                                                                                                                                [
                                                                                                                                    [
                                                                                                                                        [
                                                                                                                                            [
                                                                                                                                                [
                                                                                                                                                    [
                                                                                                                                                        [
                                                                                                                                                            [
                                                                                                                                                                [
                                                                                                                                                                    [
                                                                                                                                                                        [
                                                                                                                                                                            [
                                                                                                                                                                                [
                                                                                                                                                                                    [
                                                                                                                                                                                        [
                                                                                                                                                                                            [
                                                                                                                                                                                                [
                                                                                                                                                                                                    [
                                                                                                                                                                                                        [
                                                                                                                                                                                                            [
                                                                                                                                                                                                                [
                                                                                                                                                                                                                    [
                                                                                                                                                                                                                        [
                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                                                                        1
                                                                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                ]
                                                                                                                                                                                                            ]
                                                                                                                                                                                                        ]
                                                                                                                                                                                                    ]
                                                                                                                                                                                                ]
                                                                                                                                                                                            ]
                                                                                                                                                                                        ]
                                                                                                                                                                                    ]
                                                                                                                                                                                ]
                                                                                                                                                                            ]
                                                                                                                                                                        ]
                                                                                                                                                                    ]
                                                                                                                                                                ]
                                                                                                                                                            ]
                                                                                                                                                        ]
                                                                                                                                                    ]
                                                                                                                                                ]
                                                                                                                                            ]
                                                                                                                                        ]
                                                                                                                                    ]
                                                                                                                                ]
                                                                                                                            ]
                                                                                                                        ]
                                                                                                                    ]
                                                                                                                ]
                                                                                                            ]
                                                                                                        ]
                                                                                                    ]
                                                                                                ]
                                                                                            ]
                                                                                        ]
                                                                                    ]
                                                                                ]
                                                                            ]
                                                                        ]
                                                                    ]
                                                                ]
                                                            ]
                                                        ]
                                                    ]
                                                ]
                                            ]
                                        ]
                                    ]
                                ]
                            ]
                        ]
                    )
                ).encode(),
                None,
                "deeper than 64",
            ),
        ],
    )
    async def test_ambiguous_mistyped_or_too_deep_bodies_get_an_openai_400_and_reach_nothing(
        self, proxy, upstream, logs, raw, param, fragment
    ):
        response = await raw_request(proxy.port, "POST", "/v1/chat/completions", raw, JSON)
        error = response.json()["error"]
        assert response.status == 400 and error["type"] == "invalid_request_error" and error["param"] == param
        assert fragment in error["message"] and upstream.received == []
        assert [e["status"] for e in logs.events("request")] == [400]

    async def test_unknown_fields_are_forwarded_byte_for_byte(self, proxy, upstream):
        raw = b'{"model":"gpt-4o","messages":[{"role":"user","content":"hi","x-note":{"k":[1,2.50,1e400]}}],"seed":123456789012345678901234567890,"metadata":{"tools":5}}'
        response = await raw_request(proxy.port, "POST", "/v1/chat/completions", raw, JSON)
        assert response.status == 200 and upstream.received[-1].body == raw
