"""Streaming through context-guard: chunks arrive as the upstream sends them."""

import os

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1"))
stream = client.chat.completions.create(
    model="gpt-4o-mini", stream=True, messages=[{"role": "user", "content": "Count from 1 to 10."}]
)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print(chunk.choices[0].delta.content, end="", flush=True)
print()
