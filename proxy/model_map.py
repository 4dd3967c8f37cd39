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
    """The model map at `path`, or litellm's bundled one, each entry with its `FIELDS` only.
    Entries that are not objects are dropped."""
    source = path or bundled_model_map_path()
    if source is None:
        raise ConfigError("no model map: litellm's bundled map is not installed and models.map_file is not set")
    try:
        # The standard library's parser, not orjson: orjson keeps a process-wide cache of the keys
        # it has read, which would hold about 2,000 of the map's model names for good, scattered
        # over the memory of the 3 MB parse and keeping 2-3 MB of it from being handed back.
        data = json.loads(source.read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model map {source} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"model map {source} is not a JSON object")
    # About 4,200 entries hold some 430 distinct field sets: entries with equal fields share one
    # (read-only) dict. The types are part of the key, so that 1, 1.0 and true stay apart.
    distinct: dict[tuple[tuple[str, type, Any], ...], dict[str, Any]] = {}
    kept: dict[str, dict[str, Any]] = {}
    for key, entry in data.items():
        if not isinstance(entry, dict) or key == "sample_spec":
            continue
        fields = {field: entry[field] for field in FIELDS if field in entry}
        try:
            kept[key] = distinct.setdefault(tuple((k, type(v), v) for k, v in fields.items()), fields)
        except TypeError:  # a value that is a list or an object: kept as it is, unshared
            kept[key] = fields
    return kept
