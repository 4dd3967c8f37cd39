"""OpenAI's shapes: Chat Completions, Responses and legacy completions, as the core's chat view."""
