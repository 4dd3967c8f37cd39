"""Azure OpenAI through context-guard: the deployment in the path names the model; api-version is kept."""

import os

from openai import AzureOpenAI

client = AzureOpenAI(
    azure_endpoint=os.environ.get("AZURE_OPENAI_ENDPOINT", "http://127.0.0.1:8080"),
    api_key=os.environ.get("AZURE_OPENAI_API_KEY", "unused-behind-the-guard"),
    api_version="2024-10-21",
)
# `model` is the deployment name: map it to a model in the guard's config (models.overrides alias_of).
raw = client.chat.completions.with_raw_response.create(
    model=os.environ.get("AZURE_DEPLOYMENT", "prod-gpt4o"), messages=[{"role": "user", "content": "Hello from Azure"}]
)
print(raw.parse().choices[0].message.content)
print("tokens before:", raw.headers.get("x-context-guard-tokens-before"))
