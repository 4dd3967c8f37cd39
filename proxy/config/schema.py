"""Plain data (what YAML gives) -> frozen dataclasses, checked against their type hints.

The settings are frozen dataclasses whose annotations are their schema: `int`, `float`, `bool`,
`str`, `Literal[...]`, `tuple[X, ...]`, `dict[str, X]`, unions (`X | None`), other dataclasses,
and `Annotated[X, Bounds(ge=...)]` for limits. `build(cls, data)` converts a mapping into `cls`:
an unknown key, a missing one, a value of the wrong type or out of bounds is a `SchemaError`
that names where it is (`server.port`, `models.overrides[0].match`) and why in plain words
(`must be at most 65535, not 70000`). Checks across fields live in each class's
`__post_init__`: a `ValueError` there is that section's error, a `SchemaError` names its own key.

Values are read as a YAML file or an environment variable gives them: a number may come as
the text of one (`"8080"`), and true/false as `yes`/`no`, `on`/`off`, `1`/`0`. `strict=True`
takes each value only as its own type (a strategy's options).

Written for the settings rather than taken from a validation library: it is what start-up
time and memory were spent on (a quarter of both before), and it is all the settings need.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import operator
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar, Union

T = TypeVar("T")

# A field whose metadata holds this is filled by the loader, not the operator (an upstream's name,
# the settings' source): it is never listed among the keys known at its place.
INTERNAL = {"internal": True}


@dataclass(frozen=True, slots=True)
class Bounds:
    """Limits of a number, or the fewest items of a list or mapping, as `Annotated` metadata."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    min_length: int | None = None

    def check(self, value: Any, given: Any) -> None:
        """`value` within the bounds, or a SchemaError that shows it as `given` (before conversion)."""
        if self.min_length is not None and len(value) < self.min_length:
            what = "character(s)" if isinstance(value, str) else "item(s)"
            raise SchemaError(f"must hold at least {self.min_length} {what}")
        for words, limit, within in (
            ("at least", self.ge, operator.ge),
            ("greater than", self.gt, operator.gt),
            ("at most", self.le, operator.le),
            ("less than", self.lt, operator.lt),
        ):
            if limit is not None and not within(value, limit):
                raise SchemaError(f"must be {words} {_number(limit)}, not {shown(given)}")

PositiveFloat = Annotated[float, Bounds(gt=0)]


class SchemaError(ValueError):
    """A value that does not fit the schema: `message` says why, `location` where (keys and
    list indices from the root being built)."""

    def __init__(self, message: str, location: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.message, self.location = message, location

    def within(self, *outer: str | int) -> SchemaError:
        return SchemaError(self.message, (*outer, *self.location))

    def __str__(self) -> str:
        where = dotted(self.location)
        return f"{where}: {self.message}" if where else self.message


def dotted(location: tuple[str | int, ...]) -> str:
    """`("models", "overrides", 0, "match")` -> `models.overrides[0].match`."""
    out = ""
    for part in location:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def reason(exc: ValueError) -> str:
    """The reason of a settings error without its place (a caller that names the place itself)."""
    return exc.message if isinstance(exc, SchemaError) else str(exc)


def build(cls: Any, data: Any, *, strict: bool = False) -> Any:
    """`cls` (a dataclass) from `data`, a mapping of its fields, every value converted and checked."""
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise SchemaError("must be a mapping")
    fields = _fields(cls)
    values: dict[str, Any] = {}
    for key, value in data.items():
        hint = fields.get(key)
        if hint is None:
            known = ", ".join(sorted(name for name in fields if name not in _internal(cls)))
            raise SchemaError(f"unknown setting; known here: {known}", (str(key),))
        try:
            values[key] = convert(hint, value, strict=strict)
        except SchemaError as exc:
            raise exc.within(key) from None
    missing = [name for name in fields if name in _required(cls) and name not in values]
    if missing:
        raise SchemaError("is required", (missing[0],))
    try:
        return cls(**values)
    except SchemaError:
        raise
    except ValueError as exc:  # a check across fields (__post_init__); any other exception is a bug
        raise SchemaError(str(exc)) from None


def convert(hint: Any, value: Any, *, strict: bool = False) -> Any:
    """`value` as `hint` describes it, or a SchemaError (its location relative to `value`)."""
    origin = typing.get_origin(hint)
    if origin is Annotated:
        inner, *extras = typing.get_args(hint)
        converted = convert(inner, value, strict=strict)
        for extra in extras:
            if isinstance(extra, Bounds):
                extra.check(converted, value)
        return converted
    if origin is Union or origin is types.UnionType:
        return _union(typing.get_args(hint), value, strict)
    if origin is Literal:
        choices = typing.get_args(hint)
        if any(value == c and type(value) is type(c) for c in choices):
            return value
        raise SchemaError(f"must be one of {', '.join(map(str, choices))}, not {shown(value)}")
    if origin is tuple or origin is list:
        if not isinstance(value, list | tuple):
            raise SchemaError(f"must be a list, not {shown(value)}")
        item = typing.get_args(hint)[0]
        return tuple(_at(i, item, v, strict) for i, v in enumerate(value))
    if origin is dict or origin is Mapping:
        if not isinstance(value, Mapping):
            raise SchemaError(f"must be a mapping, not {shown(value)}")
        key_hint, item = typing.get_args(hint)
        return {convert(key_hint, k, strict=True): _at(k, item, v, strict) for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        return build(hint, value, strict=strict)
    if hint is Any:
        return value
    scalar = _SCALARS.get(hint)
    if scalar is None:
        raise TypeError(f"the settings schema has a type it cannot read: {hint!r}")
    return scalar(value, strict)


def plain(value: Any) -> Any:
    """A dataclass (and what it holds) as JSON-ready data: mappings, lists and scalars; the fields
    that are not the operator's (`INTERNAL`) left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        hidden = _internal(type(value))
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value) if f.name not in hidden}
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def shallow(value: Any) -> dict[str, Any]:
    """A dataclass's fields as a mapping of their values as they are (to be built again with changes)."""
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


def carried(target: type[T], section: object, renamed: Mapping[str, str] | None = None, **given: Any) -> T:
    """The core's `target` (a policy, an options object) made from a settings `section`: each of
    its fields from the setting of the same name, or the one `renamed` maps it to; `given` as
    passed; a field the section has no setting for keeps the target's default."""
    names = renamed or {}
    values = {
        f.name: getattr(section, names.get(f.name, f.name))
        for f in dataclasses.fields(target)  # type: ignore[arg-type]  # every target is a dataclass
        if f.name not in given and hasattr(section, names.get(f.name, f.name))
    }
    return target(**values, **given)


def _at(key: str | int, hint: Any, value: Any, strict: bool) -> Any:
    try:
        return convert(hint, value, strict=strict)
    except SchemaError as exc:
        raise exc.within(key) from None


def _union(members: tuple[Any, ...], value: Any, strict: bool) -> Any:
    if value is None:
        if type(None) in members:
            return None
        raise SchemaError("must be set, not null")
    errors: list[tuple[Any, SchemaError]] = []
    for member in members:
        if member is type(None):
            continue
        try:
            return convert(member, value, strict=strict)
        except SchemaError as failed:
            errors.append((member, failed))
    # The error of the member that the value's own shape points to: a list for a list, and so on.
    shaped = [error for member, error in errors if _shaped_like(member, value)]
    raise (shaped or [errors[0][1]])[0]


def _shaped_like(hint: Any, value: Any) -> bool:
    base = typing.get_args(hint)[0] if typing.get_origin(hint) is Annotated else hint
    origin = typing.get_origin(base)
    if isinstance(value, list | tuple):
        return origin in (tuple, list)
    if isinstance(value, Mapping):
        return origin in (dict, Mapping) or dataclasses.is_dataclass(base)
    return origin not in (tuple, list, dict, Mapping) and not dataclasses.is_dataclass(base)


_INT = re.compile(r"[+-]?\d+")
_TRUE, _FALSE = frozenset({"true", "yes", "on", "1"}), frozenset({"false", "no", "off", "0"})


def _int(value: Any, strict: bool) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not strict:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str) and _INT.fullmatch(value.strip()):
            with contextlib.suppress(ValueError):  # more digits than Python reads from text
                return int(value)
    raise SchemaError(f"must be a whole number, not {shown(value)}")


def _float(value: Any, strict: bool) -> float:
    number = math.nan
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if numeric or (isinstance(value, str) and not strict):
        with contextlib.suppress(ValueError, OverflowError):  # not a number; an integer beyond a float
            number = float(value)
    if math.isnan(number):
        raise SchemaError(f"must be a number, not {shown(value)}")
    return number


def _bool(value: Any, strict: bool) -> bool:
    if isinstance(value, bool):
        return value
    if not strict:
        text = value.strip().lower() if isinstance(value, str) else str(value) if value in (0, 1) else None
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise SchemaError(f"must be true or false, not {shown(value)}")


def _str(value: Any, strict: bool) -> str:
    if isinstance(value, str):
        return value
    raise SchemaError(f"must be a string, not {shown(value)}")


_SCALARS = {int: _int, float: _float, bool: _bool, str: _str}


@functools.cache
def _fields(cls: Any) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


@functools.cache
def _required(cls: Any) -> frozenset[str]:
    missing = dataclasses.MISSING
    return frozenset(
        f.name for f in dataclasses.fields(cls) if f.init and f.default is missing and f.default_factory is missing
    )


@functools.cache
def _internal(cls: Any) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls) if f.metadata.get("internal"))


def shown(value: Any) -> str:
    """`value` as an error shows it: its repr, cut short (a key holding a whole document)."""
    try:
        text = repr(value)
    except ValueError:  # an integer with more digits than Python writes out
        return "a number too long to show"
    return text if len(text) <= 80 else f"{text[:77]}..."


def _number(limit: float) -> str:
    return str(int(limit)) if float(limit).is_integer() else str(limit)
