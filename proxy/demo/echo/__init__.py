"""A built-in upstream that answers every API the guard serves with what reached it.

A testing aid, never a default. It calls no model: `context-guard demo` and
`context-guard serve --upstream echo` put it behind the guard so that anyone can see, with no key
and no network, what the guard forwarded. For each request it reports the number of messages and
their roles (of the request's chat view, as the guard reads every API), its own count of the
prompt (the project's chat-format accounting, with the model family's tokenizer loaded from local
files, as an upstream's `usage` would report it), every tool call with whether its result
arrived, and whether the conversation is valid for a chat API (no tool result without its call,
no call without its results).

The report is the reply's text, for a person reading a chat client, and the answer's extra `echo`
field, for a program (the SDKs keep unknown fields). It answers, whole or streamed:

    report.py            the settings, the report and the reply every shape renders (pure data)
    openai_shapes.py     chat completions, legacy completions, embeddings (OpenAI's shapes)
    responses_answer.py  the Responses API, with its event sequence
    messages_answer.py   Anthropic Messages, with its events and its error shape
    gemini_answer.py     Gemini's generateContent, streamGenerateContent and countTokens
    echo_app.py          the routes, the counting, errors in each path's shape, running it

Each answer is built by `proxy.demo.provider_answers` and streamed by `proxy.demo.event_stream`,
which every fake upstream shares (the tests' and the benchmark's); what is the echo's own is the
report it adds.

`GET /v1/models` lists the ids in `EchoSettings.models`; any model name is answered.
"""

from proxy.demo.echo.echo_app import (
    OWNER,
    START_TIMEOUT_SECONDS,
    UPSTREAM_NAME,
    EchoUpstream,
    echo_in_thread,
    running_echo,
    with_echo_upstream,
)
from proxy.demo.echo.report import EchoReport, EchoSettings, ToolCallSeen

__all__ = [
    "OWNER",
    "START_TIMEOUT_SECONDS",
    "UPSTREAM_NAME",
    "EchoReport",
    "EchoSettings",
    "EchoUpstream",
    "ToolCallSeen",
    "echo_in_thread",
    "running_echo",
    "with_echo_upstream",
]
