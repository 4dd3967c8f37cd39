"""Tool calls through context-guard: a call and its results are always kept or dropped together."""

import json
import os

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1"))
tools = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
messages = [{"role": "user", "content": "What's the weather in Lisbon?"}]
reply = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools).choices[0].message
if reply.tool_calls:
    messages.append(reply.model_dump(exclude_none=True))
    for call in reply.tool_calls:
        messages.append(
            {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"city": "Lisbon", "celsius": 21})}
        )
    reply = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools).choices[0].message
print(reply.content)
