"""Every body error, whichever layer raised it, becomes the same OpenAI-shaped 400 naming its field."""

from __future__ import annotations

import pytest

from proxy.apis.base import InvalidRequest
from proxy.core.plan import InvalidBody
from proxy.errors import BadRequest
from proxy.server.edge.body import bad_body_errors, parse_chat
from proxy.wire.codec import UnreadableJson
from tests.server.raw_http import raw_request

JSON = {"Content-Type": "application/json"}


def mapped(error: Exception) -> BadRequest:
    with pytest.raises(BadRequest) as caught, bad_body_errors():
        raise error
    return caught.value


class TestBadBodyErrors:
    @pytest.mark.parametrize(
        "error",
        [
            UnreadableJson("the request body is ambiguous: 'model' twice", param="model"),
            InvalidBody("the request body is ambiguous: 'model' twice", param="model"),
            InvalidRequest("the request body is ambiguous: 'model' twice", param="model"),
        ],
        ids=["wire", "core", "apis"],
    )
    def test_each_layer_s_body_error_is_the_same_400_with_its_field(self, error):
        assert mapped(error).status == 400
        assert mapped(error).to_openai() == {
            "error": {
                "message": "the request body is ambiguous: 'model' twice",
                "type": "invalid_request_error",
                "param": "model",
                "code": "invalid_request",
            }
        }

    def test_json_that_names_no_key_maps_to_no_param(self):
        assert mapped(UnreadableJson("the request body is not valid JSON: x")).param is None

    def test_other_errors_pass_through_untranslated(self):
        with pytest.raises(KeyError), bad_body_errors():
            raise KeyError("not a body error")


class TestParseChat:
    @pytest.mark.parametrize(
        ("raw", "param"),
        [(b'{"model":"a","model":"b","messages":[]}', "model"), (b'{"model":"a","messages":5}', "messages")],
        ids=["unreadable", "invalid"],
    )
    def test_the_echo_upstream_s_reader_refuses_with_the_guard_s_400(self, raw, param):
        with pytest.raises(BadRequest) as caught:
            parse_chat(raw)
        assert caught.value.status == 400 and caught.value.param == param


class TestThroughTheProxy:
    @pytest.mark.parametrize(
        ("path", "raw", "param"),
        [
            ("/v1/chat/completions", b'{"model":"gpt-4o","model":"x","messages":[]}', "model"),
            (
                "/v1/chat/completions",
                b'{"model":"gpt-4o","messages":[{"role":"user","content":5}]}',
                "messages[0].content",
            ),
            ("/v1/responses", b'{"model":"gpt-4o","input":5}', "input"),
        ],
        ids=["strict-json", "chat-checks", "responses-adapter"],
    )
    async def test_a_bad_body_gets_an_openai_400_naming_its_field_and_reaches_nothing(
        self, proxy, upstream, path, raw, param
    ):
        response = await raw_request(proxy.port, "POST", path, raw, JSON)
        error = response.json()["error"]
        assert response.status == 400 and upstream.received == []
        assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", "invalid_request", param)
