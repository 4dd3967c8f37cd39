"""Where litellm's packaged data files are: found on disk, without importing litellm
(whose import costs seconds, a hundred-odd megabytes and a remote fetch)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def litellm_file(*parts: str) -> Path | None:
    """A file or folder inside the installed litellm package, or None if it is not there."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))).joinpath(*parts)
    return path if path.exists() else None
