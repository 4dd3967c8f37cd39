"""The API shapes the guard counts, each an adapter between its own JSON and the core's
chat-completions view: chat completions, OpenAI Responses, legacy completions and Anthropic
Messages. `registry.adapter_for(path)` picks one by canonical path."""
