"""`${VAR}` and `${VAR:-default}` in the settings, replaced from the environment before they are checked.

`expand_environment()` replaces them in every string. A value that is nothing but one reference
(`port: ${PORT:-9000}`) is then read as a YAML scalar, so numbers and booleans keep their type; a
reference inside a longer string stays text. Variables that are not set and have no default are
one `ConfigError` naming every one of them and the key that holds it, so a file is fixed in one go.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from proxy.errors import ConfigError

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_environment(value: Any, env: Mapping[str, str], source: str) -> Any:
    missing: list[tuple[str, str]] = []  # (variable, key)
    expanded = _expand(value, env, "", missing)
    if len(missing) == 1:
        name, key = missing[0]
        raise ConfigError(f"environment variable {name} is not set", source=source, key=key or None)
    if missing:
        names = ", ".join(sorted({name for name, _ in missing}))
        where = "; ".join(f"{key or '(top level)'}: {name}" for name, key in missing)
        raise ConfigError(f"environment variables {names} are not set ({where})", source=source)
    return expanded


def _expand(value: Any, env: Mapping[str, str], key: str, missing: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        whole = _ENV_REF.fullmatch(value)

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in env:
                return env[name]
            if default is not None:
                return default
            missing.append((name, key))
            return ""

        expanded = _ENV_REF.sub(substitute, value)
        return _scalar(expanded) if whole else expanded
    if isinstance(value, Mapping):
        return {k: _expand(v, env, f"{key}.{k}".lstrip("."), missing) for k, v in value.items()}
    if isinstance(value, list):
        return [_expand(v, env, f"{key}[{i}]", missing) for i, v in enumerate(value)]
    return value


def _scalar(text: str) -> Any:
    """`text` as YAML would read it when it is a plain number or boolean; otherwise the text itself."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if isinstance(value, bool | int | float) and not isinstance(value, str) else text
