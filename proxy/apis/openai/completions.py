"""Legacy completions (`POST /v1/completions`) as the core's chat view.

The prompt is one text with no chat framing, so the view is one user message holding it (its
`suffix` rides along and is counted), counted with no role, no per-message framing, no default
system turn and no reply priming: the count is the prompt's tokens as the model's tokenizer
counts them, plus only what the server adds to any text (`ChatFormat.prompt_bos`: Llama's
`<|begin_of_text|>`, Mistral's `<s>`; nothing for OpenAI's models). `max_tokens` defaults to 16,
as the API's own default does.

Over budget there is no history to drop: the prompt itself is cut in the middle, keeping its
opening (instructions, usually) and its end (the newest text), with a marker saying how many
tokens went, never below `min_prompt_tokens`; or, with `overflow: reject`, the request is refused.
A batch of several prompts, or prompts given as token ids, is counted by its longest prompt
(token ids exactly, by their number) and is never cut: it fits or it is refused.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

from proxy.apis import fields
from proxy.apis.base import (
    Adapter,
    Changes,
    InvalidRequest,
    Origin,
    Parsed,
    Source,
    optional_model,
    output_reserve,
    require_object,
    stream_flag,
)
from proxy.apis.endpoints import Endpoint, Shape, ShapeOptions
from proxy.apis.fields import NOTHING_KNOWN, KnownPrefix, unread_fields
from proxy.core.counting.tokenizer import Tokenizer
from proxy.core.models.model_registry import ModelProfile
from proxy.core.trimming.strategies import build_pipeline
from proxy.core.trimming.trim import Strategy

API_DEFAULT_MAX_TOKENS = 16


@dataclass(frozen=True)
class CompletionsOptions:
    """`apis.completions` settings: what to do with a prompt over budget."""

    overflow: Literal["cut", "reject"] = "cut"
    min_prompt_tokens: int = 256  # a cut never leaves the prompt shorter than this

    def __post_init__(self) -> None:
        if self.overflow not in ("cut", "reject"):
            raise ValueError(f"apis.completions.overflow must be cut or reject, not {self.overflow!r}")
        if not isinstance(self.min_prompt_tokens, int) or self.min_prompt_tokens < 0:
            raise ValueError("apis.completions.min_prompt_tokens must be a whole number >= 0")


class CompletionsAdapter(Adapter):
    name: ClassVar[str] = "completions"
    accounted: ClassVar[frozenset[str]] = fields.COMPLETIONS
    reserve_field: ClassVar[str | None] = "max_tokens"
    reserve_view_field: ClassVar[str | None] = "max_tokens"

    def __init__(self, options: CompletionsOptions | None = None) -> None:
        self.options = options or CompletionsOptions()
        self._cut = build_pipeline(
            ("shrink_latest_user",), {"shrink_latest_user": {"min_tokens": self.options.min_prompt_tokens}}
        )

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        body = require_object(body)
        model = optional_model(body, required=False)
        prompt = body.get("prompt", "")
        text, origin, token_ids, batch = _prompt(prompt)
        message: dict[str, Any] = {"role": "user", "content": text}
        suffix = body.get("suffix")
        if isinstance(suffix, str) and suffix:
            message["suffix"] = suffix
        chat: dict[str, Any] = {"messages": [message]}
        if model is not None:
            chat["model"] = model
        reserve = output_reserve(body, "max_tokens")
        chat["max_tokens"] = reserve if reserve is not None else API_DEFAULT_MAX_TOKENS
        notes = []
        if batch > 1:
            notes.append(f"a batch of {batch} prompts, counted by the longest in tokens; never cut")
        return Parsed(
            api=self.name,
            body=body,
            chat=chat,
            sources=(Source((origin,)),),
            model=model,
            stream=stream_flag(body),
            fixed_tokens=token_ids,
            notes=tuple(notes),
            reserve_field=self.reserve_field,
            reserve_view_field=self.reserve_view_field,
            private={"cuttable": batch == 1 and token_ids == 0},
            unread=unread_fields(body, self.accounted),
        )

    def counted_view(self, parsed: Parsed, tokenizer: Tokenizer) -> Mapping[str, Any]:
        """A batch of text prompts is counted by the one of the most tokens: the longest in
        characters may be far from it (12,000 ASCII characters are 1,500 tokens, 9,000 CJK ones
        over 20,000)."""
        prompts = parsed.body.get("prompt")
        if not (isinstance(prompts, list) and len(prompts) > 1 and all(isinstance(p, str) for p in prompts)):
            return parsed.chat
        counts = tokenizer.count_many(list(prompts))
        longest = prompts[max(range(len(prompts)), key=counts.__getitem__)]
        (message,) = parsed.chat["messages"]
        return {**parsed.chat, "messages": [{**message, "content": longest}]}

    def profile(self, profile: ModelProfile, parsed: Parsed) -> ModelProfile:
        """No chat framing: a prompt is sent as it is, with the server's BOS where it adds one.
        Token-id prompts count by their number (the server adds its BOS to those too)."""
        base = profile.chat_format
        fmt = replace(
            base,
            per_message=0,
            per_name=0,
            roles_written=False,
            role_extra=(("user", 0),),  # the view's one message: the prompt, with no role written
            default_system=0,
            reply_priming=parsed.fixed_tokens + base.prompt_bos,
        )
        return replace(profile, chat_format=fmt)

    def pipeline(self, parsed: Parsed) -> tuple[Strategy, ...] | None:
        return self._cut if self.options.overflow == "cut" and parsed.private.get("cuttable") else ()

    def _render(self, parsed: Parsed, changes: Changes) -> dict[str, Any]:
        body = dict(parsed.body)
        new = changes.replaced.get(0)
        content = new.get("content") if new is not None else None
        if isinstance(content, str):
            origin = parsed.sources[0].origins[0]
            body["prompt"] = content if origin.index is None else [content]
        return body


def _prompt(prompt: object) -> tuple[str, Origin, int, int]:
    """(text to count, where it sits, token ids to count, prompts in the batch)."""
    if isinstance(prompt, str):
        return prompt, Origin("prompt"), 0, 1
    if not isinstance(prompt, list) or not prompt:
        raise InvalidRequest("'prompt' must be a string, an array of strings or an array of token ids", param="prompt")
    if all(isinstance(p, str) for p in prompt):
        return max(prompt, key=len), Origin("prompt", 0), 0, len(prompt)
    if all(_is_token(t) for t in prompt):
        return "", Origin("prompt"), len(prompt), 1
    if all(isinstance(p, list) and all(_is_token(t) for t in p) for p in prompt):
        return "", Origin("prompt", 0), max(len(p) for p in prompt), len(prompt)
    raise InvalidRequest("'prompt' mixes strings and token ids", param="prompt")


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


COMPLETIONS_PATHS = ("/v1/completions", "/completions", "/openai/v1/completions")
_AZURE_COMPLETIONS = re.compile(r"/openai/deployments/(?P<deployment>[^/]+)/completions")


def shape(options: ShapeOptions) -> Shape:
    """Legacy completions (`apis.completions` its options), at OpenAI's paths and an Azure deployment's."""
    adapter = CompletionsAdapter(options.get("completions"))
    endpoint = Endpoint(adapter)

    def deployment(path: str) -> Endpoint | None:
        found = _AZURE_COMPLETIONS.fullmatch(path)
        return Endpoint(adapter, path_model=found["deployment"]) if found else None

    return Shape(adapter.name, (adapter,), dict.fromkeys(COMPLETIONS_PATHS, endpoint), deployment)
