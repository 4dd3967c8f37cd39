"""The hash that keys the count cache: equal bytes share a key whichever module takes it, and a
large buffer is hashed by a call that lets go of the GIL."""

from __future__ import annotations

import orjson

from proxy.core.counting.request_count import digest
from proxy.core.slices import SLICE_BYTES
from proxy.wire.array_bytes import located_body

MiB = 1024 * 1024


class TestDigest:
    def test_a_buffer_up_to_a_slice_is_keyed_by_its_hash(self) -> None:
        """The cheap key for every ordinary message."""
        data = b'{"role":"user","content":"hi"}'
        assert digest(data) == hash(data)
        assert digest(b"a" * SLICE_BYTES) == hash(b"a" * SLICE_BYTES)

    def test_equal_large_buffers_share_a_digest_and_a_changed_byte_changes_it(self) -> None:
        first = b"a" * (3 * MiB)
        second = bytes(bytearray(first))  # another object, the same bytes
        changed = first[:-1] + b"b"
        assert digest(first) == digest(second)
        assert digest(first) != digest(changed)
        assert isinstance(digest(first), int)

    def test_an_element_read_from_the_body_and_the_same_message_rendered_share_a_key(self) -> None:
        """The prefix reader keys each element by its bytes as received and the counter a message
        by its compact JSON; a client that writes compactly gets one key either way, small or large."""
        messages = [{"role": "user", "content": "short"}, {"role": "user", "content": "x" * (2 * MiB)}]
        raw = orjson.dumps({"model": "gpt-4o", "messages": messages})
        located = located_body(raw, orjson.loads(raw), "messages")
        assert located is not None
        assert list(located.hashes) == [digest(orjson.dumps(m)) for m in messages]
