"""What the provider reads that the guard cannot see as text, bounded from above: ciphertext.

Codex and other Responses clients send their model's reasoning back with every turn as
`reasoning` items whose `encrypted_content` the provider decrypts into the context. The guard
cannot read it, but its size bounds it: base64 of `n` characters decodes to at most `3n/4`
bytes, the plaintext is no longer than the ciphertext, and every token of a byte-level
tokenizer stands for at least one byte, so the reasoning counts at most that many tokens. The
bound assumes the plaintext is not compressed before it is encrypted (nothing published says
either way); it errs high by the ciphertext's own overhead and by every multi-byte token.

Context held by id (a stored response, a conversation, a cache) is counted elsewhere: from the
ledger of the provider's own answers (`proxy.state.store`), as the exchange's `held`.
"""

from __future__ import annotations

# A view message's field: the tokens the ciphertext it carries (the encrypted reasoning before a
# Responses item) decodes to at most. Counted with the message, so it goes when the message goes.
CIPHERTEXT_TOKENS = "context_guard_ciphertext_tokens"
# What the note an adapter writes for such a bound says (`Parsed.notes`), for the record to name it.
CIPHERTEXT_NOTE = "encrypted reasoning, an upper bound"


def base64_bytes(text: str) -> int:
    """The most bytes `text` decodes to as base64 (standard or URL-safe, padded or not): every
    four characters that are not padding carry three bytes."""
    return len(text.rstrip("=")) * 3 // 4
