"""The two things the settings loader does besides validating: `${VAR}` expansion and error wording.

`expand_environment()` replaces `${VAR}` and `${VAR:-default}` in every string. A value that is
nothing but one reference (`port: ${PORT:-9000}`) is then read as a YAML scalar, so numbers and
booleans keep their type; a reference inside a longer string stays text.

`config_error()` turns pydantic's `ValidationError` into the one `ConfigError` the operator sees:
the file, the dotted key (`upstreams.vertex.base_url`, `models.overrides[0].tokenizer`) and a
reason in plain words; an unknown key lists the keys known at that place.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from proxy.errors import ConfigError

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_environment(value: Any, env: Mapping[str, str], source: str, key: str = "") -> Any:
    if isinstance(value, str):
        whole = _ENV_REF.fullmatch(value)

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            raise ConfigError(f"environment variable {name} is not set", source=source, key=key or None)

        expanded = _ENV_REF.sub(substitute, value)
        return _scalar(expanded) if whole else expanded
    if isinstance(value, Mapping):
        return {k: expand_environment(v, env, source, f"{key}.{k}".lstrip(".")) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_environment(v, env, source, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


def _scalar(text: str) -> Any:
    """`text` as YAML would read it when it is a plain number or boolean; otherwise the text itself."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, bool | int | float) and not isinstance(value, str) else text


def config_error(exc: ValidationError, source: str, root: type[BaseModel]) -> ConfigError:
    """The first error of `exc` as a ConfigError naming `source` and the dotted key."""
    error = exc.errors(include_url=False)[0]
    location = [part for part in error["loc"] if not (isinstance(part, str) and part.startswith("function-"))]
    message = _wording(error)
    if error["type"] in ("extra_forbidden", "unexpected_keyword_argument"):
        known = sorted(_fields_at(root, location[:-1]))
        message = f"unknown setting; known here: {', '.join(known)}"
    elif error["type"] == "missing":
        message = "is required"
    elif (named := _OWN_KEY.match(message)) and named.group(1).startswith(_dotted(location)):
        # a cross-field check names its own, more precise key
        return ConfigError(message[named.end() :], source=source, key=named.group(1))
    if error["type"] in _TYPE_ERRORS and "input" in error:
        message = f"{message}, not {error['input']!r}"
    return ConfigError(message, source=source, key=_dotted(location) or None)


_OWN_KEY = re.compile(r"^([a-z_]+(?:\[\d+\])?(?:\.[\w]+(?:\[\d+\])?)*): ")
_TYPE_ERRORS = frozenset(
    {"int_parsing", "int_type", "float_parsing", "float_type", "bool_parsing", "bool_type", "string_type",
     "literal_error", "int_from_float", "greater_than_equal", "less_than_equal", "greater_than", "less_than",
     "tuple_type", "list_type", "dict_type", "model_type"}
)  # fmt: skip


def reason(exc: ValueError) -> str:
    """The one-line reason of a ValueError, or of the first error of a pydantic ValidationError."""
    if isinstance(exc, ValidationError):
        error = exc.errors(include_url=False)[0]
        message = _wording(error)
        return f"{message}, not {error['input']!r}" if error["type"] in _TYPE_ERRORS else message
    return str(exc)


def _wording(error: Any) -> str:
    """pydantic's reason in the words an operator expects."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind in ("int_parsing", "int_type", "int_from_float"):
        return "must be a whole number"
    if kind in ("float_parsing", "float_type"):
        return "must be a number"
    if kind in ("bool_parsing", "bool_type"):
        return "must be true or false"
    if kind == "string_type":
        return "must be a string"
    if kind in ("tuple_type", "list_type"):
        return "must be a list"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        return "must be a mapping"
    if kind == "literal_error":
        expected = str(ctx.get("expected", "")).replace("'", "").replace(" or ", ", ")
        return f"must be one of {expected}"
    if kind in ("greater_than_equal", "greater_than"):
        return f"must be at least {ctx.get('ge', ctx.get('gt'))}" + (" (exclusive)" if kind == "greater_than" else "")
    if kind in ("less_than_equal", "less_than"):
        return f"must be at most {ctx.get('le', ctx.get('lt'))}" + (" (exclusive)" if kind == "less_than" else "")
    return str(error["msg"]).removeprefix("Value error, ")


def _dotted(location: list[Any]) -> str:
    out = ""
    for part in location:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _fields_at(model: type[BaseModel], path: list[Any]) -> set[str]:
    """The field names of the model found by following `path` from `model` (dict keys and list
    indices are stepped over)."""
    current: type[BaseModel] | None = model
    for part in path:
        if current is None or isinstance(part, int) or part not in current.model_fields:
            continue  # a list index or a dict key: the model stays the one found so far
        annotation = current.model_fields[part].annotation
        if dataclasses.is_dataclass(annotation):
            return {f.name for f in dataclasses.fields(annotation)}
        current = _inner_model(annotation)
    return set(current.model_fields) - {"source", "name"} if current is not None else set()


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _inner_model(arg)
        if found is not None:
            return found
    return None
