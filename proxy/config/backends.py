"""What the config says about the kind of server behind an upstream, and how the guard may ask it
to count (`upstreams.<name>.kind`, `.tokenize` and their timeouts): the settings' side of
`proxy.server.backends`, which does the asking."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

Kind = Literal["openai", "vertex", "vllm", "llamacpp", "ollama", "generic"]
KINDS: tuple[str, ...] = get_args(Kind)
TokenizeMode = Literal["auto", "local", "backend"]
TOKENIZE_MODES: tuple[str, ...] = get_args(TokenizeMode)


@dataclass(frozen=True, slots=True)
class BackendOptions:
    """Per-upstream options (YAML `upstreams.<name>.kind`, `.tokenize`, `.discovery_timeout`,
    `.tokenize_timeout`, `.framing_timeout`, `.tokenize_concurrency`)."""

    kind: Kind | Literal["auto"] = "auto"
    tokenize: TokenizeMode = "auto"  # auto: the backend's tokenizer where it has one
    discovery_timeout: float = 3.0  # all of discovery, at start
    tokenize_timeout: float = 2.0  # the remote counting of one request, all calls together
    framing_timeout: float = 30.0  # measuring the template's framing, once per model
    tokenize_concurrency: int = 4
    min_output_tokens: int | None = None  # kept free where the server lowers max_tokens; None: default reserve

    @property
    def declared(self) -> Kind:
        """The kind assumed until the server says more: the one declared, `generic` for `auto`."""
        return "generic" if self.kind == "auto" else self.kind

    @property
    def decided_by_server(self) -> bool:
        """`auto`: what the server's endpoints answer decides its kind; else the operator's word stands."""
        return self.kind == "auto"

    @property
    def probed(self) -> bool:
        """Whether discovery may ask the server anything: hosted APIs (`openai`, `vertex`) never are."""
        return self.kind not in ("openai", "vertex")

    def __post_init__(self) -> None:
        if self.kind != "auto" and self.kind not in KINDS:
            raise ValueError(f"kind must be auto or one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.tokenize not in TOKENIZE_MODES:
            raise ValueError(f"tokenize must be one of {', '.join(TOKENIZE_MODES)}, not {self.tokenize!r}")
        if not 0 < self.discovery_timeout <= 60:
            raise ValueError("discovery_timeout must be between 0 and 60 seconds")
        if not 0 < self.tokenize_timeout <= 60:
            raise ValueError("tokenize_timeout must be between 0 and 60 seconds")
        if not 0 < self.framing_timeout <= 300:
            raise ValueError("framing_timeout must be between 0 and 300 seconds")
        if not 1 <= self.tokenize_concurrency <= 64:
            raise ValueError("tokenize_concurrency must be between 1 and 64")
        if self.min_output_tokens is not None and self.min_output_tokens < 0:
            raise ValueError("min_output_tokens must be >= 0")
