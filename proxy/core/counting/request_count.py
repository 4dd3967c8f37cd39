"""Counting a whole chat-completions body cheaply: `RequestCounter` applies the rules of
`proxy.core.counting.count_rules` to every message and keeps what lets the next request skip work.

An agent re-sends its conversation, its tools and its system prompt with every request, so most of
a request was counted before. The bookkeeping here finds that out without counting again:

- each message's count is kept in the count cache under a key: the hash of its bytes as received
  (`proxy.wire.prefix_reader`) or of its compact JSON, scoped to this tokenizer, chat format and
  image pricing, and for a tool result to the call it answers (`_message_keys`);
- the counts of a conversation's opening and their sums are kept as an `Opening`
  (`proxy.core.counting.count_cache`), so a request that extends it walks only the messages after;
- the tool definitions are counted once per set of definitions (and first system message);
- the large texts of the messages the cache does not have are encoded in one batch before the
  walk, so the encoder gets one large job instead of thousands of calls (`_prefetch`).

None of it changes a count: with no cache, `request()` gives the same `RequestCount`.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import orjson

from proxy.core.costs.tool_calls import ResultContext, flag_groups, result_contexts, scan_calls
from proxy.core.costs.tools import ToolsCount, first_system_text, tool_definitions_tokens
from proxy.core.counting.count_cache import (
    NO_TALLY,
    CountCache,
    Opening,
    Tally,
    count_text,
    opening_key,
    sizes_to_keep,
    sizes_to_look_up,
    still_marked_alike,
)
from proxy.core.counting.count_rules import CountRules, MessageCount, RequestCount
from proxy.core.counting.tokenizer import Tokenizer, note_bounded_text
from proxy.core.models.model_registry import ModelProfile
from proxy.core.slices import SLICE_BYTES
from proxy.core.work_budget import BLOCK_UNITS, ITEM_UNITS, content_blocks, spend


def digest(data: bytes) -> int:
    """The hash of bytes that keys the count cache, for a message's compact JSON here and for an
    element's bytes as received (`proxy.wire.array_bytes`): equal bytes, equal digests, whichever
    takes them. `hash(data)` up to `SLICE_BYTES`; above, BLAKE2b's 8 bytes, because `hash` holds
    the GIL over the whole buffer (55 ms for 31 MiB, the event loop waiting) and BLAKE2b lets go."""
    if len(data) <= SLICE_BYTES:
        return hash(data)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)


_last_definitions: tuple[tuple[Any, ...], int] = ((), 0)  # the fields `definitions_hash` saw last, and theirs


def definitions_hash(fields: tuple[Any, ...]) -> int:
    """The hash of the tool definition fields' compact JSON. The very objects it was asked about
    last reuse their hash without dumping them again: the prefix reader hands the unchanged
    fields of a conversation re-sent as the objects it read before (values it reads are never
    changed in place), and an agent sends the same tools with every request. Raises TypeError
    for what orjson cannot render."""
    global _last_definitions
    last, found = _last_definitions  # one read: a thread replacing the pair meanwhile is harmless
    if len(last) == len(fields) and all(map(operator.is_, last, fields)):
        return found
    found = digest(orjson.dumps(fields))
    _last_definitions = (fields, found)
    return found


class RequestCounter(CountRules):
    """Counts bodies for one model profile with one tokenizer, reusing what a count cache holds;
    cheap to build per request. Built for one body as read (`proxy.wire.prefix_reader`), it is
    given what the reader knew of its messages: `message_hashes`, one per message, the hashes of
    their bytes as received (keys for the count cache: `_message_keys`), and `shared_messages`,
    how many of its first messages the reader found in an earlier body's bytes (`request`)."""

    def __init__(
        self,
        profile: ModelProfile,
        tokenizer: Tokenizer,
        cache: CountCache | None = None,
        message_hashes: Sequence[int] = (),
        shared_messages: int = 0,
    ) -> None:
        super().__init__(profile, tokenizer, cache)
        self.message_hashes, self.shared_messages = message_hashes, shared_messages
        # Counts of this request's large texts, encoded in one batch before the walk; keyed by
        # object identity, holding the text so that the identity stays valid.
        self._prefetched: dict[int, tuple[str, int]] = {}
        self._scope = hash((tokenizer.identity, profile.rules_hash))

    def text(self, text: str) -> int:
        """A text's count: from the batch encoded before the walk when it is one of its texts."""
        hit = self._prefetched.get(id(text))
        if hit is not None and hit[0] is text:
            return hit[1]
        return count_text(self.tokenizer, text, self.cache)

    def request(self, body: Mapping[str, Any]) -> RequestCount:
        """The body's count. With the hashes of its messages (one per message: those of the
        body this counter was built for), the counts of the opening it shares with a request
        counted before are carried (`proxy.core.counting.count_cache`); `shared_messages` is where
        its siblings part from it."""
        recording = note_bounded_text()  # what is counted by a bound instead of encoded (proxy.core.counting.bound)
        messages = body.get("messages")
        messages = messages if isinstance(messages, list) else []
        spend(ITEM_UNITS * len(messages))  # each message is looked up, split into turns and maybe cut
        spend(BLOCK_UNITS * content_blocks(messages))  # each part hashed, looked at and maybe cut
        counts, tally = self._counts_with_openings(messages, self.message_hashes, self.shared_messages)
        return self.totals(body, messages, counts, tally, recording)

    def _tool_definitions(self, body: Mapping[str, Any]) -> ToolsCount:
        """Tool definitions' count (`CountRules.totals` asks), from the cache when the same
        definitions were counted before: an agent sends the same tools with every request. The
        key holds the first system message too, which the namespace joins (its hash is the
        string's own, kept with it: a re-sent system message is the very string read before,
        `proxy.wire.prefix_reader`)."""
        if self.cache is None or not (body.get("tools") or body.get("functions")):
            return tool_definitions_tokens(body, self.tokenizer, self.fmt, self.cache)
        fields = (body.get("tools"), body.get("functions"), body.get("tool_choice"), body.get("function_call"))
        messages = body.get("messages")
        system = first_system_text(messages) if isinstance(messages, list) else None
        try:
            key = (self._scope, "tools", definitions_hash(fields), hash(system))
        except TypeError:
            return tool_definitions_tokens(body, self.tokenizer, self.fmt, self.cache)
        count: ToolsCount | None = self.cache.get(key)
        if count is None:
            count = tool_definitions_tokens(body, self.tokenizer, self.fmt, self.cache)
            self.cache.put(key, count)
        return count

    def _message_keys(self, messages: list[Any], hashes: Sequence[int] = (), start: int = 0) -> list[Hashable | None]:
        """A cache key per message from `start` on: the digest of its compact JSON (which tells `1`, `1.0` and
        `true` apart), scoped to this tokenizer, chat format and image pricing, and for a tool
        result to the call it answers. None without a cache, or for a message orjson cannot
        render (integers beyond 64 bits). `hashes`, when there is one per message, are hashes of
        the messages' bytes as received: equal bytes read as equal messages, so they key the
        same counts (and where a client wrote a message as orjson does, it is the same key)."""
        if self.cache is None:
            return [None] * (len(messages) - start)
        scope, dumps, results = self._scope, orjson.dumps, self._results
        if len(hashes) == len(messages):
            return [(scope, hashes[i], results.get(i)) for i in range(start, len(messages))]
        try:  # one loop, and `digest` the one call of ours per message: this runs for every message of every request
            return [(scope, digest(dumps(messages[i])), results.get(i)) for i in range(start, len(messages))]
        except TypeError:
            return [self._message_key(messages[i], i) for i in range(start, len(messages))]

    def _message_key(self, message: object, index: int) -> Hashable | None:
        try:
            return (self._scope, digest(orjson.dumps(message)), self._results.get(index))
        except TypeError:
            return None

    def _prefetch(self, messages: Sequence[Any]) -> None:
        """Count the large texts of the messages given in one batch (cache misses only), so that
        the encoder sees one large job it can spread over threads instead of thousands of calls."""
        floor = self.cache.min_chars if self.cache is not None else 256
        texts: list[str] = []
        for message in messages:
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if isinstance(content, str):
                if len(content) >= floor:
                    texts.append(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str) and len(part["text"]) >= floor:
                        texts.append(part["text"])
        if len(texts) < 2:
            return
        counts = (
            self.cache.count_many(self.tokenizer, texts) if self.cache is not None else self.tokenizer.count_many(texts)
        )
        self._prefetched = {id(t): (t, n) for t, n in zip(texts, counts, strict=True)}

    def _counts_with_openings(
        self, messages: list[Any], hashes: Sequence[int], shared: int = 0
    ) -> tuple[tuple[MessageCount, ...], Tally]:
        """Every message's count and their sums; the tool results' contexts in `_results`. An
        opening counted before is carried with its sums (no walk over it), and this request's
        openings are kept for the next."""
        cache, n = self.cache, len(messages)
        if cache is None or len(hashes) != n or n == 0:
            self._results = {} if no_tool_traffic(messages, 0, n) else result_contexts(messages)
            counts = self._count_messages(messages, hashes)
            return counts, NO_TALLY.plus(counts)
        keys: dict[int, Hashable] = {}  # each hashes a prefix of `hashes`: made only as far as looked
        opening: Opening | None = None
        for size in sizes_to_look_up(n, shared):
            key = keys[size] = opening_key(self._scope, hashes, size)
            opening = cache.get(key)
            if opening is not None:
                break
        start = opening.size if opening is not None else 0
        quiet = no_tool_traffic(messages, start, n)  # no call nor result after the opening: nothing to read
        if opening is not None and opening.flagged is not None and quiet:
            return self._extended(opening, messages, hashes, shared, keys)
        if opening is not None and opening.size == n:  # the very messages of a request before: a retry
            results = flag_groups(opening.contexts) if opening.contexts else {}
            if still_marked_alike(opening, results):  # its counts were made with these marks
                self._results = results
                return opening.counts, opening.tally
        calls: dict[str, ResultContext] = dict(opening.calls) if opening is not None else {}
        contexts: dict[int, ResultContext] = dict(opening.contexts) if opening is not None else {}
        keep = sizes_to_keep(n, shared, opening.size if opening is not None else 0)
        states: dict[int, tuple[dict[str, ResultContext], dict[int, ResultContext]]] = {}
        at, walk = start, not quiet
        for size in sorted(s for s in keep if s > start):  # the walk, paused where an opening is kept
            if walk:
                scan_calls(messages, at, size, calls, contexts)
            # The walk's own dicts at its end (nothing changes them after); copies where it goes on.
            states[size], at = ((calls, contexts) if size == n else (dict(calls), dict(contexts))), size
        if walk:
            scan_calls(messages, at, n, calls, contexts)
        self._results = flag_groups(contexts) if contexts else {}  # no result, no group to mark
        if opening is not None and not still_marked_alike(opening, self._results):
            opening, start = None, 0  # a result joined a parallel call of the opening: its marks moved
        carried = opening.counts if opening is not None else ()
        counts = carried + self._count_messages(messages, hashes, start)
        tally = opening.tally if opening is not None else NO_TALLY
        for size, (made, seen) in states.items():  # openings not kept before (those past the carried one)
            marked = {i: c for i, c in self._results.items() if i < size and c.group is not None}
            tally = tally.plus(counts[tally.size : size])
            key = keys.get(size) or opening_key(self._scope, hashes, size)
            # Where the request ended, the marks it was counted with (the walk's own table when no
            # call was parallel: the same contexts); a shorter one's marks may move with what follows.
            flagged = (seen if not marked else self._results) if size == n else None
            cache.put(key, Opening(size, counts[:size], made, seen, marked, tally, flagged))
        return counts, tally.plus(counts[tally.size :])

    def _extended(
        self,
        opening: Opening,
        messages: list[Any],
        hashes: Sequence[int],
        shared: int,
        keys: dict[int, Hashable],
    ) -> tuple[tuple[MessageCount, ...], Tally]:
        """The request is `opening`'s messages and messages that neither make a tool call nor
        answer one (or nothing more: a retry). Its calls, results and marks are then the
        opening's, as they stand (`Opening.flagged`, kept where a request ended): only the messages
        after it are read and counted, and the openings it keeps share the opening's tables."""
        flagged = opening.flagged
        assert flagged is not None, "only an opening kept where a request ended is extended"
        start, n = opening.size, len(messages)
        self._results = flagged
        counts = opening.counts + self._count_messages(messages, hashes, start) if start < n else opening.counts
        tally = opening.tally
        for size in sorted(s for s in sizes_to_keep(n, shared, start) if s > start):
            tally = tally.plus(counts[tally.size : size])
            key = keys.get(size) or opening_key(self._scope, hashes, size)
            kept = Opening(size, counts[:size], opening.calls, opening.contexts, opening.marked, tally, flagged)
            self.cache.put(key, kept)  # type: ignore[union-attr]  # a cache is there: the opening came from it
        return counts, tally.plus(counts[tally.size :])

    def _count_messages(
        self, messages: list[Any], hashes: Sequence[int] = (), start: int = 0
    ) -> tuple[MessageCount, ...]:
        """The count of every message from `start` on: whole messages from the cache where it
        has them, the rest counted with their large texts encoded together first."""
        keys = self._message_keys(messages, hashes, start)
        counts: list[MessageCount | None] = [None] * (len(messages) - start)
        if self.cache is not None:
            for j, hit in enumerate(self.cache.get_many(keys)):
                if hit is not None:
                    counts[j] = hit if hit.index == start + j else replace(hit, index=start + j)
        missing = [start + j for j, c in enumerate(counts) if c is None]
        self._prefetch([messages[i] for i in missing])
        try:
            for i in missing:
                count = counts[i - start] = self.message(messages[i], i)
                key = keys[i - start]
                if key is not None and self.cache is not None:
                    self.cache.put(key, count)
        finally:
            self._prefetched = {}
        return tuple(c for c in counts if c is not None)


def no_tool_traffic(messages: Sequence[Any], start: int, end: int) -> bool:
    """Whether `scan_calls` would read nothing from `messages[start:end]`: none of them is a tool
    result or makes a tool call. Asked here, before the walk, so that a conversation without tool
    traffic (most of them) does not enter the calls' code at all."""
    for index in range(start, end):
        message = messages[index]
        if type(message) is not dict and not isinstance(message, Mapping):  # as scan_calls passes it over
            continue
        if message.get("role") == "tool" or message.get("tool_calls"):
            return False
    return True
