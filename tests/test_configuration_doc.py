"""docs/configuration.md names every section and key the settings accept, so the page cannot fall
behind the schema (proxy/config/settings.py and its sections)."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path

from proxy.config.settings import Settings

PAGE = Path(__file__).parent.parent / "docs" / "configuration.md"


def keys(cls: type, prefix: str = "") -> set[str]:
    """Every key of `cls` and of the sections and items nested in it, as dotted paths."""
    found = set()
    hints = typing.get_type_hints(cls, include_extras=True)
    for field in dataclasses.fields(cls):
        if field.metadata.get("internal") or not field.init:
            continue
        path = f"{prefix}{field.name}"
        found.add(path)
        for inner in _dataclasses_in(hints[field.name]):
            found |= keys(inner, path + ".")
    return found


def _dataclasses_in(hint: object) -> list[type]:
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return [hint]
    args = typing.get_args(hint)
    if typing.get_origin(hint) is typing.Annotated:
        args = args[:1]
    elif isinstance(hint, types.UnionType) or typing.get_origin(hint) in (typing.Union, tuple, dict):
        pass
    else:
        return []
    return [found for arg in args for found in _dataclasses_in(arg)]


def named_on_the_page() -> set[str]:
    """Every identifier written in code spans or headings of the page."""
    text = PAGE.read_text(encoding="utf-8")
    spans = re.findall(r"`([^`\n]+)`", text)
    return {word for span in spans for word in re.findall(r"[a-z_][a-z0-9_]*", span)}


class TestTheConfigurationPage:
    def test_it_names_every_key_of_every_section(self):
        named = named_on_the_page()
        missing = sorted(key for key in keys(Settings) if key.rsplit(".", 1)[-1] not in named)
        assert missing == []

    def test_each_section_has_a_heading(self):
        text = PAGE.read_text(encoding="utf-8")
        sections = [field.name for field in dataclasses.fields(Settings) if not field.metadata.get("internal")]
        assert [s for s in sections if f"## `{s}`" not in text] == []

    def test_the_walk_reaches_nested_items(self):
        """The check above covers upstream, route, override and summariser keys, not only sections."""
        found = keys(Settings)
        assert {"upstreams.api_key_env", "routes.rename", "models.overrides.alias_of"} <= found
        assert {"trim.summariser.deadline_seconds", "apis.completions.min_prompt_tokens"} <= found
