"""What reached the echo upstream: its settings, the report it answers with, and the reply every
API shape renders (pure data)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from proxy.demo.provider_answers import Usage, words


@dataclass(frozen=True)
class EchoSettings:
    """What the echo upstream can be told: the model ids it lists, and the largest body it reads."""

    models: tuple[str, ...] = ("echo",)  # listed by GET /v1/models; any name is answered
    max_body_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        if not self.models or not all(isinstance(m, str) and m.strip() for m in self.models):
            raise ValueError(f"echo models must be a non-empty list of model ids, not {self.models!r}")
        if not isinstance(self.max_body_bytes, int) or self.max_body_bytes < 1024:
            raise ValueError(
                f"echo max_body_bytes must be a whole number of at least 1024, not {self.max_body_bytes!r}"
            )


@dataclass(frozen=True)
class ToolCallSeen:
    id: str
    name: str
    answered: bool  # a `tool` message with this call's id reached the echo
    result_tokens: int  # the content tokens of that result (0 when unanswered)


@dataclass(frozen=True)
class EchoReport:
    """What reached the echo upstream in one request, read as its chat view."""

    model: str
    messages: int
    roles: tuple[str, ...]
    prompt_tokens: int
    tokenizer: str
    exact: bool  # False when the tokenizer is an estimate for this model family
    tool_calls: tuple[ToolCallSeen, ...]
    problems: tuple[str, ...]  # why the conversation is invalid for a chat API; empty when valid

    @property
    def valid(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data: the response's `echo` field."""
        data = asdict(self)
        data.update(roles=list(self.roles), tool_calls=list(data["tool_calls"]), problems=list(self.problems))
        return {**data, "valid": self.valid}

    def text(self) -> str:
        """The report as the reply a person reads."""
        per_role = Counter(self.roles)
        roles = ", ".join(f"{n} {role}" for role, n in per_role.items())
        how = "" if self.exact else ", an estimate"
        parts = [
            f"Echo from context-guard's testing upstream; no model was called. "
            f"{self.messages} messages reached me ({roles}): {self.prompt_tokens:,} prompt tokens "
            f"by {self.tokenizer}{how}."
        ]
        if self.tool_calls:
            calls = ", ".join(
                f"{c.name} ({c.id}) {'with its result' if c.answered else 'WITHOUT a result'}" for c in self.tool_calls
            )
            parts.append(f"Tool calls: {calls}.")
        parts.append("The conversation is valid." if self.valid else f"INVALID: {'; '.join(self.problems)}.")
        return " ".join(parts)


@dataclass(frozen=True)
class Reply:
    """One answer before it takes an API's shape: the report, its text and the token counts."""

    report: EchoReport
    text: str
    completion_tokens: int
    created: int
    suffix: str  # a random part for the ids the answer carries

    @property
    def model(self) -> str:
        return self.report.model

    @property
    def prompt_tokens(self) -> int:
        return self.report.prompt_tokens

    @property
    def usage(self) -> Usage:
        return Usage(input=self.report.prompt_tokens, output=self.completion_tokens)

    @property
    def pieces(self) -> list[str]:
        """The text as a stream sends it: a few words a piece."""
        return words(self.text, per=8)

    @property
    def echo(self) -> dict[str, Any]:
        """The report as the answer's extra `echo` field."""
        return self.report.to_dict()


def call_names(message: Mapping[str, Any]) -> list[str]:
    calls = message.get("tool_calls")
    names = []
    for call in calls if isinstance(calls, list) else []:
        if isinstance(call, Mapping) and isinstance(call.get("id"), str):  # the calls `call_ids` lists
            function = call.get("function")
            name = function.get("name") if isinstance(function, Mapping) else None
            names.append(name if isinstance(name, str) else "?")
    return names


def text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""
