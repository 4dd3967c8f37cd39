#!/usr/bin/env bash
# Installs every runtime dependency at the floor pyproject.toml declares (`name==floor`), the dev
# extra's test tools at their newest versions that fit, and the project with --no-deps, into a
# fresh venv outside the repo; then runs the default suite there. Slow (10-15 minutes on two
# cores), so not part of CI: run it after raising or lowering a floor (docs/development.md).
#
#   scripts/check-floors.sh [pytest arguments]
#
# PYTHON picks the interpreter (default python3.11, the oldest the project supports);
# FLOORS_VENV the venv's folder (default /tmp/floors-venv, rebuilt each run).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3.11}
venv=${FLOORS_VENV:-/tmp/floors-venv}
constraints=$venv/floors.txt

rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/pip" install -q -U pip

# One pin per package: the highest floor any runtime or dev specifier states for it (the dev
# extra asks a newer openai than `context-guard demo` needs). Test tools whose own dependencies
# need more than a runtime floor are left out, and the tests that use them skip themselves:
# langchain-core's langsmith needs orjson>=3.9.14.
"$venv/bin/python" - "$repo/pyproject.toml" "$constraints" <<'EOF'
import re
import sys
import tomllib

project = tomllib.load(open(sys.argv[1], "rb"))["project"]
runtime = project["dependencies"]
dev = project["optional-dependencies"]["dev"]
skipped = {"langchain-core", "langchain-openai"}


def parse(spec):
    name = re.match(r"[A-Za-z0-9._-]+", spec).group(0).lower()
    floor = re.search(r">=\s*([0-9][0-9.]*)", spec)
    return name, floor.group(1) if floor else None


def key(version):
    return tuple(int(part) for part in version.split("."))


floors = {}
for spec in runtime + dev:
    name, floor = parse(spec)
    if spec in runtime and floor is None:
        sys.exit(f"runtime dependency {spec!r} states no floor")
    if spec in runtime or (name in floors and floor is not None):
        floors[name] = max(floors.get(name, floor), floor, key=key)
names = [parse(spec)[0] for spec in runtime + dev if parse(spec)[0] not in skipped]
with open(sys.argv[2], "w") as out:
    out.writelines(f"{name}=={floor}\n" for name, floor in floors.items())
with open(sys.argv[2] + ".names", "w") as out:
    out.writelines(f"{name}\n" for name in dict.fromkeys(names))
EOF

echo "floors:"
sed 's/^/  /' "$constraints"
"$venv/bin/pip" install -q -c "$constraints" $(cat "$constraints.names")
"$venv/bin/pip" install -q --no-deps -e "$repo"
"$venv/bin/pip" check
cd "$repo"
PYTHONPATH=$repo "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
