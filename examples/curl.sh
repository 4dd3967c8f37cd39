#!/usr/bin/env sh
# A chat completion with curl; -i shows the x-context-guard-* headers.
curl -sS -i "${OPENAI_BASE_URL:-http://127.0.0.1:8080/v1}/chat/completions" \
  -H "Content-Type: application/json" \
  -H "Authorization: Bearer ${OPENAI_API_KEY:-sk-placeholder}" \
  -d '{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello!"}]}'
