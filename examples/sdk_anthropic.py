"""Claude through context-guard with the official anthropic SDK: a tool loop, streaming, and count_tokens.

Run the guard with Claude routed to Anthropic (`context-guard serve --config examples/anthropic.yaml`,
which sends ANTHROPIC_API_KEY upstream), or with no key at all against the echo upstream
(`context-guard serve --upstream echo`); then `python examples/sdk_anthropic.py`.
"""

import os

from anthropic import Anthropic

# The guard sends its own key upstream when its config names one; the client's is then never forwarded.
client = Anthropic(
    base_url=os.environ.get("ANTHROPIC_BASE_URL", "http://127.0.0.1:8080"),
    api_key=os.environ.get("ANTHROPIC_API_KEY", "the-guard-sends-its-own"),
)
weather = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}
messages: list = []
for i in range(150):
    messages += [
        {"role": "user", "content": f"Tell me fact {i} about rivers."},
        {"role": "assistant", "content": f"Fact {i}: rivers carve valleys over millions of years. " * 5},
    ]
messages.append({"role": "user", "content": "What is the weather in Paris?"})
model = "claude-sonnet-4-6"

print("input tokens:", client.messages.count_tokens(model=model, messages=messages, tools=[weather]).input_tokens)
reply = client.messages.create(model=model, max_tokens=512, messages=messages, tools=[weather])
for block in reply.content:
    if block.type == "tool_use":  # the tool_use and its tool_result are kept or dropped together
        messages += [
            {"role": "assistant", "content": reply.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": block.id, "content": "clear sky"}]},
        ]
with client.messages.stream(model=model, max_tokens=512, messages=messages, tools=[weather]) as stream:
    for text in stream.text_stream:
        print(text, end="")
print()
