"""Gemini through context-guard with the official google-genai SDK: the Developer API and Vertex AI.

Run the guard with a `kind: gemini` upstream (base URL https://generativelanguage.googleapis.com,
`api_key_env: GEMINI_API_KEY`) or with `--config examples/vertex-ai.yaml`, or with no key at all
against the echo upstream (`context-guard serve --upstream echo`); then `python examples/sdk_gemini.py`
(set GEMINI_VERTEX=1 to send it the way google-genai talks to Vertex AI).
"""

import os

from google import genai
from google.genai import types

guard = types.HttpOptions(base_url=os.environ.get("GEMINI_BASE_URL", "http://127.0.0.1:8080"))
if os.environ.get("GEMINI_VERTEX"):
    from google.oauth2.credentials import Credentials

    # The guard sends its own token upstream when its config names one (token_command); this one is not forwarded then.
    client = genai.Client(
        vertexai=True,
        project=os.environ.get("VERTEX_PROJECT", "my-project"),
        location=os.environ.get("VERTEX_LOCATION", "us-central1"),
        credentials=Credentials(token=os.environ.get("VERTEX_TOKEN", "the-guard-sends-its-own")),
        http_options=guard,
    )
else:
    client = genai.Client(api_key=os.environ.get("GEMINI_API_KEY", "the-guard-sends-its-own"), http_options=guard)

weather = types.Tool(
    function_declarations=[
        types.FunctionDeclaration(
            name="get_weather",
            description="Weather for a city",
            parameters_json_schema={"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        )
    ]
)
contents: list = []
for i in range(150):
    contents += [
        types.Content(role="user", parts=[types.Part(text=f"Tell me fact {i} about rivers.")]),
        types.Content(role="model", parts=[types.Part(text=f"Fact {i}: rivers carve valleys over ages. " * 5)]),
    ]
contents.append(types.Content(role="user", parts=[types.Part(text="What is the weather in Paris?")]))
model = "gemini-2.5-flash"
config = types.GenerateContentConfig(system_instruction="Answer briefly.", tools=[weather], max_output_tokens=512)

print("input tokens:", client.models.count_tokens(model=model, contents=contents).total_tokens)
reply = client.models.generate_content(model=model, contents=contents, config=config)
for call in reply.function_calls or ():  # the call and its response are kept or dropped together
    contents += [
        reply.candidates[0].content,  # sent back as it came, thought signatures and all
        types.Content(role="user", parts=[types.Part.from_function_response(name=call.name, response={"sky": "sun"})]),
    ]
for chunk in client.models.generate_content_stream(model=model, contents=contents, config=config):
    print(chunk.text or "", end="")
print()
