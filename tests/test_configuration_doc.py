"""docs/configuration.md names every section and key the settings accept, and gives each the
default the settings' own dataclasses give it, so the page cannot fall behind the schema
(proxy/config/settings.py and its sections)."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

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


def table_rows(text: str) -> list[tuple[str, str, str]]:
    """(section, key cell, default cell) of every row of a `| key | default | ... |` table under a
    section's heading."""
    rows, section = [], ""
    for line in text.splitlines():
        if heading := re.fullmatch(r"## `(\w+)`", line):
            section = heading[1]
        elif section and line.startswith("| `"):
            key, default = [cell.strip() for cell in line.strip("|").split("|")[:2]]
            rows.append((section, key, default))
    return rows


def section_class(section: str) -> type:
    """The dataclass of a section, or of one item of it (an upstream, a route)."""
    hint = typing.get_type_hints(Settings, include_extras=True)[section]
    (found,) = _dataclasses_in(hint)
    return found


def default_of(cls: type, dotted: str) -> Any:
    """The default the dataclass gives `dotted` (a key, or a path into a nested section);
    `dataclasses.MISSING` for a required key."""
    name, _, rest = dotted.partition(".")
    field = {f.name: f for f in dataclasses.fields(cls)}[name]
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return dataclasses.MISSING
    for part in rest.split(".") if rest else ():
        value = getattr(value, part)
    return value


def as_yaml(value: Any) -> Any:
    """A default as YAML reads it back: tuples as lists, nested sections as mappings."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_yaml(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [as_yaml(item) for item in value]
    return value


def documented_defaults() -> list[tuple[str, str, Any, Any]]:
    """(section, key, the page's default, the dataclass default) for every key in the tables."""
    found = []
    for section, key_cell, default_cell in table_rows(PAGE.read_text(encoding="utf-8")):
        names = re.findall(r"`([^`]+)`", key_cell)
        written = re.findall(r"`([^`]*)`", default_cell)
        if not written:  # no default: the key is required
            written = [None] * len(names) if default_cell == "required" else [default_cell]
        if len(written) == 1:  # one default for keys written together
            written *= len(names)
        assert len(written) == len(names), f"{section}: {key_cell} has {default_cell}"
        cls = section_class(section)
        for name, text in zip(names, written, strict=True):
            page = dataclasses.MISSING if text is None else yaml.safe_load(text)
            default = default_of(cls, name)
            found.append((section, name, page, as_yaml(default) if default is not dataclasses.MISSING else default))
    return found


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

    def test_every_default_in_its_tables_is_the_dataclass_default(self):
        """Each `| key | default |` row, read as YAML, equals what a key left out of the file takes;
        a required key says `required`."""
        wrong = [(f"{s}.{k}", page, code) for s, k, page, code in documented_defaults() if page != code]
        assert wrong == []

    def test_the_tables_give_a_default_for_most_keys(self):
        """The check above reads the tables it means to: the sections' rows, upstreams' included."""
        read = {f"{section}.{key}" for section, key, _, _ in documented_defaults()}
        assert {"server.port", "upstreams.kind", "upstreams.api_key_env", "apis.completions.overflow"} <= read
        assert len(read) >= 80
