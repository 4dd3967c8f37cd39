"""The package's layers hold: every import runs down (or across one layer), never up, and no two
modules import each other, however indirectly.

    core < errors < apis, providers < config, wire, tokenizers, state, logging < server < demo, cli

`proxy.core` is pure (counting, budgets, trims); the adapters in `proxy.apis` turn each API shape
into the core's view; configuration, the JSON readers at the edge, the vocabularies and learned
state sit above them; the aiohttp shell above those; the command line on top. The imports are read
from the source (every `import`, at the top or inside a function), so a call-time import made to
dodge a circle counts as what it is.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "proxy"
MAX_LINES = 400
MAX_BREADTH = 12  # modules and subfolders in one folder: beside the size rule, so splitting a file never makes a bag

LAYERS: dict[str, int] = {
    "proxy.core": 0,
    "proxy.errors": 1,
    "proxy.apis": 2,
    "proxy.providers": 2,  # one object per upstream kind: beside the adapters, below the settings that resolve them
    "proxy.config": 3,
    "proxy.wire": 3,
    "proxy.tokenizers": 3,
    "proxy.state": 3,
    "proxy.logging": 3,
    "proxy": 3,  # the package's own __init__ (its version)
    "proxy.server": 4,
    "proxy.demo": 5,
    "proxy.cli": 5,
    "proxy.__main__": 5,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    """The layer of the longest prefix of `module` that LAYERS names."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        layer = LAYERS.get(".".join(parts[:end]))
        if layer is not None:
            return layer
    raise AssertionError(f"{module} is in no layer: add its package to LAYERS")


def imports_of(path: Path, known: set[str]) -> set[str]:
    """The modules of the package that `path` imports (`from proxy.x import y` names `proxy.x.y`
    when that is a module, else `proxy.x`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("proxy"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("proxy") and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in known else node.module)
    return found & known


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: imports_of(path, set(MODULES)) - {name} for name, path in MODULES.items()}


class TestLayers:
    def test_every_module_has_a_layer(self):
        for name in MODULES:
            layer_of(name)

    @pytest.mark.parametrize("name", sorted(MODULES))
    def test_imports_run_down_never_up(self, name):
        upward = {other for other in GRAPH[name] if layer_of(other) > layer_of(name)}
        assert not upward, f"{name} (layer {layer_of(name)}) imports from above: {sorted(upward)}"

    def test_the_core_never_imports_the_shell(self):
        """The core is pure: nothing outside proxy.core, and not aiohttp (tests/core/test_purity.py
        checks the loaded modules at run time)."""
        for name, targets in GRAPH.items():
            if name.startswith("proxy.core"):
                assert all(t.startswith("proxy.core") for t in targets), (name, targets)


class TestNoCircles:
    def test_no_module_reaches_itself_through_its_imports(self):
        circles: list[list[str]] = []
        state: dict[str, int] = {}  # 1: on the current path, 2: done

        def visit(name: str, path: list[str]) -> None:
            state[name] = 1
            for target in sorted(GRAPH[name]):
                if state.get(target) == 1:
                    circles.append([*path[path.index(target) :], target])
                elif target not in state:
                    visit(target, [*path, target])
            state[name] = 2

        for name in sorted(GRAPH):
            if name not in state:
                visit(name, [name])
        assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


class TestModuleSize:
    @pytest.mark.parametrize("name", sorted(MODULES))
    def test_no_module_is_over_400_lines(self, name):
        lines = len(MODULES[name].read_text("utf-8").splitlines())
        assert lines <= MAX_LINES, f"{MODULES[name].relative_to(ROOT)} has {lines} lines: split it where it does two jobs"


class TestFolders:
    """Folders grouped by concept: each a dozen modules at most, and one name per file."""

    @pytest.mark.parametrize("folder", sorted({p.parent for p in PACKAGE.rglob("*.py")}), ids=str)
    def test_no_folder_holds_more_than_a_dozen_modules_and_subfolders(self, folder):
        entries = [p for p in folder.iterdir() if p.name != "__init__.py" and not p.name.startswith((".", "__"))]
        entries = [p for p in entries if p.suffix == ".py" or (p.is_dir() and any(p.rglob("*.py")))]
        assert len(entries) <= MAX_BREADTH, (
            f"{folder.relative_to(ROOT)} holds {len(entries)}: group them by concept into subfolders"
        )

    def test_every_file_name_is_used_once(self):
        seen: dict[str, list[str]] = {}
        for path in PACKAGE.rglob("*.py"):
            if path.name != "__init__.py":
                seen.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
        assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}

    def test_every_folder_is_a_package(self):
        """So setuptools ships it and its docstring says what it groups."""
        folders = {p.parent for p in PACKAGE.rglob("*.py")}
        assert {str(f.relative_to(ROOT)) for f in folders if not (f / "__init__.py").is_file()} == set()


class TestNoNameBranching:
    """Nothing in the core, the server or the error tree branches on an API shape's or an upstream
    kind's name: what differs between shapes is asked of their adapters (`proxy.apis`), what
    differs between kinds of their providers (`proxy.providers`). A comparison with such a name,
    written out or through a constant that holds names, and a table keyed by them are what this
    finds (the names come from the two registries)."""

    SCANNED = ("proxy/core", "proxy/server", "proxy/errors.py")
    # What a name that holds an API shape or an upstream kind is called (`endpoint.api`, `upstream.kind`).
    SPEAKS_OF = frozenset({"api", "kind", "shape", "upstream_kind", "backend_kind"})

    @staticmethod
    def names() -> frozenset[str]:
        from proxy.apis.registry import API_NAMES, AdapterRegistry, endpoint_api
        from proxy.providers.kinds import KINDS

        adapters = {adapter.name for adapter in AdapterRegistry().adapters}
        counted_locally = {endpoint_api(e) for e in AdapterRegistry().exact.values()}
        return frozenset({*KINDS, *API_NAMES, *adapters, *counted_locally})

    @staticmethod
    def strings(node: ast.AST) -> list[str] | None:
        """The strings a literal holds (a string, or a tuple, list or set of them; a dict's keys;
        `frozenset({...})`), or None for anything else."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [key for key in node.keys if key is not None]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set"):
            return TestNoNameBranching.strings(node.args[0]) if len(node.args) == 1 else None
        else:
            return None
        found = [item.value for item in items if isinstance(item, ast.Constant) and isinstance(item.value, str)]
        return found if found and len(found) == len(items) else None

    def files(self) -> list[Path]:
        paths: list[Path] = []
        for scanned in self.SCANNED:
            path = ROOT / scanned
            paths += sorted(path.rglob("*.py")) if path.is_dir() else [path]
        return paths

    def constants(self, names: frozenset[str]) -> set[str]:
        """Module-level constants (anywhere in the package) whose value is only such names."""
        held: set[str] = set()
        for path in sorted(PACKAGE.rglob("*.py")):
            for node in ast.parse(path.read_text("utf-8")).body:
                target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
                if isinstance(node, ast.AnnAssign):
                    target = node.target
                value = getattr(node, "value", None)
                strings = self.strings(value) if isinstance(target, ast.Name) and value is not None else None
                if strings and len(strings) > 1 and set(strings) <= names:
                    held.add(target.id)  # type: ignore[union-attr]  # a Name, checked above
        return held

    def speaks_of(self, node: ast.AST) -> bool:
        """`node` reads an API shape's or an upstream kind's name (`api`, `parsed.api`, `u.kind`)."""
        return (isinstance(node, ast.Name) and node.id in self.SPEAKS_OF) or (
            isinstance(node, ast.Attribute) and node.attr in self.SPEAKS_OF
        )

    def branching(self) -> list[str]:
        names = self.names()
        constants = self.constants(names)
        found: list[str] = []
        for path in self.files():
            where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if isinstance(node, ast.Compare):
                    operands = (node.left, *node.comparators)
                    through_constant = any(
                        (isinstance(o, ast.Name) and o.id in constants)
                        or (isinstance(o, ast.Attribute) and o.attr in constants)
                        for o in operands
                    )
                    written = any(set(self.strings(o) or ()) & names for o in operands)
                    if through_constant or (written and any(self.speaks_of(o) for o in operands)):
                        found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("startswith", "endswith")
                    and self.speaks_of(node.func.value)
                    and any(set(self.strings(a) or ()) & names for a in node.args)
                ):
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
                elif isinstance(node, ast.Dict):
                    strings = self.strings(node)
                    if strings and len(strings) > 1 and set(strings) <= names:
                        found.append(f"{where}:{node.lineno}: a table keyed by {', '.join(strings)}")
        return found

    def test_no_api_name_or_upstream_kind_is_compared_or_keyed_on(self):
        found = self.branching()
        assert not found, "ask the adapter or the provider instead:\n" + "\n".join(found)

    def test_the_check_finds_what_it_looks_for(self, tmp_path, monkeypatch):
        """A comparison with a kind, one through a constant and a table keyed by shapes are each found."""
        sample = tmp_path / "proxy" / "server" / "sample.py"
        sample.parent.mkdir(parents=True)
        sample.write_text(
            'if upstream.kind == "anthropic":\n    pass\n'
            'if api in NAMED:\n    pass\n'
            'TABLE = {"chat": 1, "messages": 2}\n'
            'if removal.kind == "dropped":\n    pass\n'
            'if parsed.api.startswith("generate_content"):\n    pass\n'
            'if tool_choice == "auto":\n    pass\n',
            "utf-8",
        )
        monkeypatch.setattr(TestNoNameBranching, "SCANNED", (str(sample),))
        monkeypatch.setattr(TestNoNameBranching, "constants", lambda self, names: {"NAMED"})
        found = self.branching()
        assert [line.split(":")[1] for line in found] == ["1", "3", "5", "8"]
