"""Encrypted reasoning bounded by what its ciphertext can decode to."""

from __future__ import annotations

import base64
import os

from proxy.core.counting.ciphertext import base64_bytes, ciphertext_tokens


class TestBase64Bytes:
    def test_is_exactly_what_the_text_decodes_to(self):
        for size in (0, 1, 2, 3, 4, 100, 1001):
            data = os.urandom(size)
            assert base64_bytes(base64.b64encode(data).decode()) == size
            assert base64_bytes(base64.urlsafe_b64encode(data).decode().rstrip("=")) == size


class TestCiphertextTokens:
    def test_sums_the_reasoning_items_ciphertexts(self):
        cipher = base64.b64encode(os.urandom(6_000)).decode()  # 8,000 characters
        body = {
            "input": [
                {"type": "reasoning", "encrypted_content": cipher, "summary": []},
                {"role": "user", "content": "hi"},
            ]
        }
        assert ciphertext_tokens(body) == 6_000

    def test_counts_nothing_for_a_body_without_them(self):
        assert ciphertext_tokens({"input": "hi"}) == 0
        assert (
            ciphertext_tokens(
                {"input": [{"type": "reasoning", "summary": []}, {"type": "message", "encrypted_content": "AAAA"}]}
            )
            == 0
        )
