"""A legacy completion through context-guard: a prompt over the budget is cut in the middle, head and tail kept."""

import os

from openai import OpenAI

client = OpenAI(base_url=os.environ.get("OPENAI_BASE_URL", "http://127.0.0.1:8080/v1"))
prompt = "Summarise this log.\n" + "INFO request served in 12 ms\n" * 5000 + "ERROR disk full\nSummary:"
raw = client.completions.with_raw_response.create(model="gpt-3.5-turbo-instruct", prompt=prompt, max_tokens=100)
print(raw.parse().choices[0].text)
print(
    "tokens before/after:",
    raw.headers.get("x-context-guard-tokens-before"),
    raw.headers.get("x-context-guard-tokens-after"),
)
