"""A client's own prompt template (vLLM's `chat_template`) can put any text at all into the prompt,
where the guard cannot count it: in enforce mode such a request is refused before it reaches the
upstream, unless the operator forwards it (`trim.client_templates: forward`)."""

from __future__ import annotations

import openai
import pytest

from proxy.errors import ConfigError
from tests.server.conftest import gateway_settings

MESSAGES = [{"role": "user", "content": "hello"}]
# What a template may do: the messages, then pages of text no count of the messages includes.
TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}" + "padding " * 2000


def sdk(proxy) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key="sk-client", max_retries=0)


class TestClientTemplates:
    @pytest.mark.parametrize(
        ("extra", "param"),
        [
            ({"chat_template": TEMPLATE}, "chat_template"),
            # vLLM takes a template passed among the template's arguments the same way
            ({"chat_template_kwargs": {"chat_template": TEMPLATE}}, "chat_template_kwargs.chat_template"),
        ],
        ids=["chat_template", "chat_template_kwargs.chat_template"],
    )
    async def test_a_request_with_its_own_template_is_refused_in_the_api_s_shape_and_not_forwarded(
        self, proxy, upstream, logs, extra, param
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk(proxy).chat.completions.create(model="gpt-4o", messages=MESSAGES, extra_body=extra)
        error = refused.value.body
        assert refused.value.status_code == 400 and isinstance(error, dict)
        assert error["code"] == "client_template_refused" and error["param"] == param
        assert "trim.client_templates: forward" in error["message"]
        assert upstream.received == []
        line = logs.events("request")[-1]
        assert line["error"] == "client_template_refused" and line["mode"] == "enforce" and line["upstream"] == "fake"

    async def test_the_template_s_own_arguments_are_not_a_template(self, proxy, upstream):
        await sdk(proxy).chat.completions.create(
            model="gpt-4o", messages=MESSAGES, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
        )
        assert len(upstream.received) == 1

    async def test_a_null_template_is_no_template(self, proxy, upstream):
        await sdk(proxy).chat.completions.create(model="gpt-4o", messages=MESSAGES, extra_body={"chat_template": None})
        assert len(upstream.received) == 1

    @pytest.mark.parametrize(
        "sections",
        [{"trim": {"client_templates": "forward"}}, {"trim": {"mode": "dry_run"}}, {"trim": {"mode": "off"}}],
        ids=["allowed by the operator", "dry run", "off"],
    )
    async def test_it_is_forwarded_as_it_came_where_the_operator_says_so_or_nothing_is_enforced(
        self, start_proxy, upstream, logs, sections
    ):
        proxy = await start_proxy(gateway_settings(upstream.url, **sections))
        await sdk(proxy).chat.completions.create(
            model="gpt-4o", messages=MESSAGES, extra_body={"chat_template": TEMPLATE}
        )
        assert upstream.received[-1].json()["chat_template"] == TEMPLATE
        if sections["trim"].get("mode") != "off":  # counted, and the template named as not counted
            assert logs.events("request")[-1]["unread_fields"] == ["chat_template"]

    def test_a_policy_other_than_refuse_or_forward_is_a_config_error(self, upstream):
        with pytest.raises(ConfigError, match="client_templates"):
            gateway_settings(upstream.url, trim={"client_templates": "strip"})
