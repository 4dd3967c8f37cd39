"""Reads the model map: litellm's bundled JSON of context windows, without importing litellm.

`import litellm` costs seconds and a hundred-odd megabytes and first tries a remote fetch of this
same file; its packaged copy is all we need, read once at start.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

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
        data = orjson.loads(source.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise ConfigError(f"model map {source} cannot be read: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"model map {source} is not a JSON object")
    return {
        key: {field: entry[field] for field in FIELDS if field in entry}
        for key, entry in data.items()
        if isinstance(entry, dict) and key != "sample_spec"
    }
