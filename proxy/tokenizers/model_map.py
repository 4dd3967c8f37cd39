"""Reads the model map: litellm's bundled JSON of context windows, without importing litellm.

`import litellm` costs seconds and a hundred-odd megabytes and first tries a remote fetch of this
same file; its packaged copy is all we need, read once at start. Entries that disagree with the
provider's documentation are corrected as it loads (`proxy.tokenizers.map_corrections`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proxy.errors import ConfigError
from proxy.tokenizers.bundled import litellm_file
from proxy.tokenizers.map_corrections import corrected

_FILE_NAME = "model_prices_and_context_window_backup.json"
# What `proxy.core.models.model_registry` reads of an entry. The map's prices and capabilities (about 40 fields
# per model) are dropped as it loads: 1 MB kept instead of 5.
FIELDS = ("mode", "max_input_tokens", "max_tokens", "max_output_tokens")


def bundled_model_map_path() -> Path | None:
    return litellm_file(_FILE_NAME)


def load_model_map(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """The model map at `path`, or litellm's bundled one, each entry with its `FIELDS` only (equal
    entries share one read-only dict). Entries that are not objects are dropped."""
    source = path or bundled_model_map_path()
    if source is None:
        raise ConfigError("no model map: litellm's bundled map is not installed and models.map_file is not set")
    try:
        # The standard library's parser, not orjson: orjson keeps a process-wide cache of the keys
        # it has read, which would hold about 2,000 of the map's model names for good, scattered
        # over the memory of the 3 MB parse and keeping 2-3 MB of it from being handed back. Each
        # entry is cut down as soon as it is read (`_Kept`), so the rest of it is freed before the
        # next is read and what is kept is not scattered among what is not: 0.6 MB resident after
        # the load instead of 3.8 MB when the parsed map was cut down afterwards, for about 25 ms
        # more of the start (the hook is Python, called for each of some 5,000 objects).
        data = json.loads(source.read_bytes(), object_pairs_hook=(kept := _Kept()))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model map {source} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"model map {source} is not a JSON object")
    model_map = {
        key: entry if id(entry) in kept.entries else kept.shared(_fields(entry))
        for key, entry in data.items()
        if isinstance(entry, dict) and key != "sample_spec"
    }
    return corrected(model_map)[0]  # where the provider's documentation says otherwise, it wins


_KEPT = frozenset(FIELDS)


class _Kept:
    """The parser's hook for each JSON object it reads. An object that holds fields of `FIELDS`
    (not objects) is an entry: cut down to them and shared with every equal one read before
    (about 4,200 entries hold some 430 distinct field sets; shared dicts are read-only, and the
    types are part of the key, so that 1, 1.0 and true stay apart). Any other object (the map
    itself, an entry's own objects, an entry without those fields) is kept as read; the loader
    drops what it does not need of it."""

    def __init__(self) -> None:
        self.distinct: dict[tuple[tuple[tuple[str, Any], ...], tuple[type, ...]], dict[str, Any]] = {}
        self.entries: dict[int, dict[str, Any]] = {}  # the entries cut down, by id (held: no id is reused)

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        read = dict(pairs)
        fields = _KEPT.intersection(read)
        if not fields or any(isinstance(read[field], dict) for field in fields):
            return read
        entry = self.shared(_fields(read))
        self.entries[id(entry)] = entry
        return entry

    def shared(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The dict equal to `fields` read first (`fields` itself if none was)."""
        try:
            return self.distinct.setdefault((tuple(fields.items()), tuple(map(type, fields.values()))), fields)
        except TypeError:  # a value that is a list: kept as it is, unshared
            return fields


def _fields(entry: dict[str, Any]) -> dict[str, Any]:
    return {field: entry[field] for field in FIELDS if field in entry}
