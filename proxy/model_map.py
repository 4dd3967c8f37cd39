"""Reads the model map: litellm's bundled JSON of context windows, without importing litellm.

`import litellm` costs seconds and a hundred-odd megabytes and first tries a remote fetch of this
same file; its packaged copy is all we need, read once at start.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from proxy.bundled import litellm_file
from proxy.errors import ConfigError

_FILE_NAME = "model_prices_and_context_window_backup.json"
# What `proxy.core.models` reads of an entry. The map's prices and capabilities (about 40 fields
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
        # object is cut down as soon as it is read (`_Kept`), so the rest of an entry is freed
        # before the next is read and what is kept is not scattered among what is not (about 3 MB
        # less resident after the load than cutting the parsed map down afterwards).
        data = json.loads(source.read_bytes(), object_pairs_hook=(kept := _Kept()))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model map {source} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"model map {source} is not a JSON object")
    return {
        key: entry if not any(isinstance(v, dict) for v in entry.values()) else kept.shared(_fields(entry))
        for key, entry in data.items()
        if isinstance(entry, dict) and key != "sample_spec"
    }


_KEPT = frozenset(FIELDS)


class _Kept:
    """The parser's hook for each JSON object it reads: the object less what no entry needs (the
    fields of `FIELDS`, and objects: the map's entries, within the map itself). An object that
    holds no object (an entry) is shared with every equal one read before: about 4,200 entries
    hold some 430 distinct field sets. Shared dicts are read-only; the types are part of the key,
    so that 1, 1.0 and true stay apart."""

    def __init__(self) -> None:
        self.distinct: dict[tuple[tuple[str, type, Any], ...], dict[str, Any]] = {}

    def __call__(self, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        kept = {key: value for key, value in pairs if key in _KEPT or isinstance(value, dict)}
        if any(isinstance(value, dict) for value in kept.values()):
            return kept  # the map, or an entry with objects of its own (cut down by the loader)
        return self.shared(kept)

    def shared(self, fields: dict[str, Any]) -> dict[str, Any]:
        """The dict equal to `fields` read first (`fields` itself if none was)."""
        try:
            return self.distinct.setdefault(tuple(sorted((k, type(v), v) for k, v in fields.items())), fields)
        except TypeError:  # a value that is a list: kept as it is, unshared
            return fields


def _fields(entry: dict[str, Any]) -> dict[str, Any]:
    return {field: entry[field] for field in FIELDS if field in entry}
