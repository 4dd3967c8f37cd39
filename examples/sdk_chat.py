"""A chat completion through context-guard with the official openai SDK: only the base URL changes."""

import os

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1"))
history = [{"role": "system", "content": "You are concise."}]
for i in range(200):  # a conversation far longer than gpt-4's 8,192 tokens
    history += [
        {"role": "user", "content": f"Tell me fact {i} about rivers."},
        {"role": "assistant", "content": f"Fact {i}: rivers carve valleys over millions of years. " * 5},
    ]
history.append({"role": "user", "content": "Which facts did we cover?"})

raw = client.chat.completions.with_raw_response.create(model="gpt-4", messages=history)
print(raw.parse().choices[0].message.content)
print(
    "tokens before/after:",
    raw.headers["x-context-guard-tokens-before"],
    raw.headers["x-context-guard-tokens-after"],
    "removed:",
    raw.headers["x-context-guard-removed"],
)
