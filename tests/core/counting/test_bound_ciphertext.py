"""Encrypted reasoning bounded by what its ciphertext can decode to."""

from __future__ import annotations

import base64
import os

from proxy.core.counting.bound import base64_bytes


class TestBase64Bytes:
    def test_is_exactly_what_the_text_decodes_to(self):
        for size in (0, 1, 2, 3, 4, 100, 1001):
            data = os.urandom(size)
            assert base64_bytes(base64.b64encode(data).decode()) == size
            assert base64_bytes(base64.urlsafe_b64encode(data).decode().rstrip("=")) == size
