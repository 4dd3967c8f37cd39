"""A frozen value's fields as the plain dict its log line, report or store keeps.

One helper instead of a `to_dict` per class that lists every field by hand: the fields go in
declaration order (or the order `names` gives), each under its own name or the one `renamed` maps
it to where the log's key differs from the attribute.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any

_NO_RENAMES: Mapping[str, str] = {}


def field_dict(
    value: Any, renamed: Mapping[str, str] = _NO_RENAMES, names: Iterable[str] | None = None
) -> dict[str, Any]:
    """`value`'s dataclass fields (or those `names` lists, in that order) by their logged names."""
    listed = names if names is not None else (f.name for f in fields(value))
    return {renamed.get(name, name): getattr(value, name) for name in listed}
