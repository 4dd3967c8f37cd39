"""An agent loop on the OpenAI Responses API through context-guard: tools, a function call, streaming."""

import os

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1"))
weather = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}
items: list = []
for i in range(150):  # a history longer than the model's window allows, once the guard's budget is set low
    items += [
        {"role": "user", "content": f"Tell me fact {i} about rivers."},
        {"role": "assistant", "content": f"Fact {i}: rivers carve valleys over millions of years. " * 5},
    ]
items.append({"role": "user", "content": "What is the weather in Paris?"})

raw = client.responses.with_raw_response.create(model="gpt-4o", instructions="Be brief.", input=items, tools=[weather])
response = raw.parse()
print(
    "tokens before/after:",
    raw.headers.get("x-context-guard-tokens-before"),
    raw.headers.get("x-context-guard-tokens-after"),
)
for item in response.output:
    if item.type == "function_call":  # answer the call; the call and its output travel as one unit
        items += [item, {"type": "function_call_output", "call_id": item.call_id, "output": '{"sky": "clear"}'}]

with client.responses.stream(model="gpt-4o", input=items, tools=[weather]) as stream:
    for event in stream:
        if event.type == "response.output_text.delta":
            print(event.delta, end="")
print()
