"""A word tokenizer that records how much text it was asked to encode, for tests of what is counted again."""

from __future__ import annotations

from proxy.core.counting.tokenizer import EncoderTokenizer


class CountingTokenizer:
    """A tokenizer that records how many characters it was asked to encode."""

    def __init__(self) -> None:
        self.encoded_chars = 0
        self.inner = EncoderTokenizer("words", str.split)

    name = "words"
    identity = "words"
    exact = True

    def count(self, text: str) -> int:
        self.encoded_chars += len(text)
        return self.inner.count(text)

    def count_many(self, texts: list[str]) -> list[int]:
        return [self.count(t) for t in texts]
