"""The state OpenAI's Responses API keeps between requests, for the suite's fake upstream: stored
responses a request continues by `previous_response_id`, conversations (`POST /v1/conversations`)
a request joins by `conversation`, and `POST /v1/responses/input_tokens`, all counted as OpenAI
counts them: every earlier input and output of the chain is in the prompt again.

Its count is the fake's own (the cookbook rule with tiktoken directly over the input items as chat
messages, `tests.support.cookbook`), never the guard's: a request's prompt is what its previous
response or its conversation holds (that response's input + output) plus what it sends. Each
response and conversation belongs to the credential that made it (OpenAI's are per project):
another credential naming it gets the provider's 404. With `limit` set, a prompt over it is
refused as OpenAI's Responses API refuses it, without numbers, unless the request asked
`truncation: "auto"` (then the oldest of what is held is dropped, as the provider does).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.cookbook import cookbook_count, encoding

OVERFLOW_MESSAGE = "Your input exceeds the context window of this model. Please adjust your input and try again."


@dataclass
class Kept:
    """A stored response or a conversation: whose it is and what it holds in a prompt."""

    owner: str
    tokens: int


def chat_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """A Responses body's instructions and input items as chat messages, for the cookbook count."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else items or []:
        kind = item.get("type", "message")
        if kind == "message":
            content = item.get("content")
            if isinstance(content, list):
                content = "".join(str(part.get("text", "")) for part in content)
            messages.append({"role": item["role"], "content": content})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "content": str(item.get("output"))})
        elif kind != "reasoning":
            messages.append({"role": "assistant", "content": json.dumps(item)})
    return messages


@dataclass
class StoredResponses:
    responses: dict[str, Kept] = field(default_factory=dict)
    conversations: dict[str, Kept] = field(default_factory=dict)
    limit: int | None = None  # the model's window, as this provider counts
    counted: list[int] = field(default_factory=list)  # the prompt of each response made, in order

    def sent_tokens(self, body: dict[str, Any]) -> int:
        """What the request itself sends, by the cookbook rule."""
        return cookbook_count({"model": body.get("model"), "messages": chat_messages(body), "tools": []})

    def held(self, body: dict[str, Any], owner: str) -> tuple[int, web.Response | None]:
        """What the named response or conversation holds, or the provider's 404 for it."""
        previous, conversation = body.get("previous_response_id"), body.get("conversation")
        conversation = conversation.get("id") if isinstance(conversation, dict) else conversation
        for name, table, ident in (
            ("previous_response_id", self.responses, previous),
            ("conversation", self.conversations, conversation),
        ):
            if ident is None:
                continue
            kept = table.get(ident)
            if kept is None or kept.owner != owner:
                message = (
                    f"{'Previous response' if table is self.responses else 'Conversation'} with id '{ident}' not found."
                )
                error = {"message": message, "type": "invalid_request_error", "param": name, "code": "not_found"}
                return 0, web.json_response({"error": error}, status=404)
            return kept.tokens, None
        return 0, None

    def prompt(self, body: dict[str, Any], owner: str) -> tuple[int, web.Response | None]:
        """The request's whole prompt (held + sent), or the provider's own refusal of it."""
        held, missing = self.held(body, owner)
        if missing is not None:
            return 0, missing
        prompt = held + self.sent_tokens(body)
        if self.limit is not None and prompt > self.limit:
            if body.get("truncation") != "auto":
                error = {
                    "message": OVERFLOW_MESSAGE,
                    "type": "invalid_request_error",
                    "param": "input",
                    "code": "context_length_exceeded",
                }
                return 0, web.json_response({"error": error}, status=400)
            prompt = self.limit  # the provider dropped the oldest of what it held
        return prompt, None

    def keep(self, ident: str, body: dict[str, Any], owner: str, tokens: int) -> str | None:
        """Store the response `ident` (input + output `tokens`); the conversation it joined, if any."""
        self.responses[ident] = Kept(owner, tokens)
        conversation = body.get("conversation")
        conversation = conversation.get("id") if isinstance(conversation, dict) else conversation
        if isinstance(conversation, str):
            self.conversations[conversation] = Kept(owner, tokens)
        return conversation if isinstance(conversation, str) else None

    def create_conversation(self, owner: str) -> dict[str, Any]:
        ident = f"conv_{len(self.conversations) + 1}"
        self.conversations[ident] = Kept(owner, 0)
        return {"id": ident, "object": "conversation", "created_at": 1, "metadata": {}}


def output_tokens(text: str) -> int:
    return len(encoding("gpt-4o").encode(text))
