"""Chat completions: the core's own shape, so the view is the body itself.

Parsing validates what the core needs (`messages`, each an object with a string `role`; a string
`model` when present: Azure deployments name the model in the path instead). Rendering returns the
trimmed body, which the core already built with every other field kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from proxy.apis.base import Adapter, InvalidRequest, Origin, Parsed, Source, optional_model, stream_flag
from proxy.core.plan import InvalidBody, validate_body
from proxy.core.trim import Removal


class ChatAdapter(Adapter):
    name: ClassVar[str] = "chat"
    writes_inserted: ClassVar[bool] = True

    def parse(self, body: object) -> Parsed:
        try:
            checked = validate_body(body)
        except InvalidBody as exc:
            raise InvalidRequest(str(exc), param=exc.param) from None
        model = optional_model(checked, required=False)
        messages = checked["messages"]
        reserve = "max_completion_tokens" if "max_completion_tokens" in checked else "max_tokens"
        return Parsed(
            api=self.name,
            body=checked,
            chat=checked,
            sources=tuple(Source((Origin("messages", i),)) for i in range(len(messages))),
            model=model,
            stream=stream_flag(checked),
            reserve_field=reserve,
            reserve_view_field=reserve,
        )

    def render(
        self, parsed: Parsed, trimmed: Mapping[str, Any], removals: Sequence[Removal], inserted: Sequence[int] = ()
    ) -> dict[str, Any]:
        """The core trimmed the body itself, every other field kept, and may have added messages
        (the budget note): the trimmed body is the answer."""
        return dict(trimmed)

