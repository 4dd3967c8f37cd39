"""The suite's own layout: what tests share lives in support modules (`tests/support/`, a
directory's helper module such as `tests/core/playbook.py`, or a `conftest.py`), never in a test
module another file imports. A test module then holds only its specification, and running or
deleting one never changes another.

The folders mirror the tree: the tests of `proxy/wire/` are in `tests/wire/`, those of
`proxy/cli.py` in `tests/cli/`, those of `bench/` in `tests/bench/`. Beside those, a folder is a
suite that runs the whole system its own way (`SUITES`) or what tests share (`SHARED`). The top of
`tests/` keeps only the checks of the whole repository (`REPOSITORY_CHECKS`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
PROXY = ROOT / "proxy"
# Suites that run the whole system in their own way (markers in pyproject.toml), and what tests share.
SUITES = frozenset({"adversarial", "compat", "components", "image", "real"})
SHARED = frozenset({"support", "data"})
# Checks of the whole repository (its layers, its docs against its code, its dependency floors,
# this layout): the only test modules at the top of tests/.
REPOSITORY_CHECKS = frozenset(
    {
        "test_architecture_doc.py",
        "test_configuration_doc.py",
        "test_dependency_floors.py",
        "test_layering.py",
        "test_test_layout.py",
    }
)
# `from tests.x.test_y import z` or `import tests.x.test_y` written inside a string (a script a
# test runs in a subprocess), which the import statements of the file itself do not show.
IMPORT_IN_TEXT = re.compile(r"\b(?:from|import)\s+tests(?:\.\w+)*\.test_\w+")


def is_test_module(dotted: str) -> bool:
    """`dotted` names a module of the suite whose name makes pytest collect it."""
    return dotted.split(".", 1)[0] == "tests" and dotted.rsplit(".", 1)[-1].startswith("test_")


def imported_modules(source: str, package: str) -> list[str]:
    """Every module `source` (a file of `package`) imports, dotted and absolute."""
    parts = package.split(".")
    names: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            names.append(module)
            names += [f"{module}.{alias.name}" for alias in node.names]  # `from tests.x import test_y`
    return names


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).parent.parts)


class TestTestModulesStandAlone:
    def test_no_file_under_tests_imports_a_test_module(self):
        offenders = {
            str(path.relative_to(ROOT)): sorted(
                {
                    name
                    for name in imported_modules(path.read_text(encoding="utf-8"), package_of(path))
                    if is_test_module(name)
                }
            )
            for path in sorted(TESTS.rglob("*.py"))
        }
        assert {path: names for path, names in offenders.items() if names} == {}

    def test_no_script_a_test_runs_imports_a_test_module(self):
        offenders = {
            str(path.relative_to(ROOT)): IMPORT_IN_TEXT.findall(path.read_text(encoding="utf-8"))
            for path in sorted(TESTS.rglob("*.py"))
            if path != Path(__file__).resolve()
        }
        assert {path: found for path, found in offenders.items() if found} == {}

    def test_the_checks_see_a_test_module_imported_every_way(self):
        """The checks above are not vacuous: each way of importing a test module is seen."""
        for source in (
            "from tests.core.trimming.test_turns import call",
            "import tests.core.trimming.test_turns",
            "from tests.core import test_turns",
            "from .test_turns import call",
            "def f():\n    from tests.core.trimming.test_turns import call",
        ):
            assert any(map(is_test_module, imported_modules(source, "tests.core"))), source
        for source in ("from tests.support.trimming import call", "from aiohttp.test_utils import TestServer"):
            assert not any(map(is_test_module, imported_modules(source, "tests.core"))), source
        assert IMPORT_IN_TEXT.search('script = "from tests.core.trimming.test_turns import call"')
        assert not IMPORT_IN_TEXT.search('script = "from tests.support.trimming import call"')


def mirrored(name: str) -> bool:
    """`tests/<name>/` mirrors something of the tree: a package or module of `proxy/`, or a
    top-level folder of the repository (`bench`, `deploy`)."""
    return (PROXY / name).is_dir() or (PROXY / f"{name}.py").is_file() or ((ROOT / name).is_dir() and name != "tests")


class TestTheTreeIsMirrored:
    def test_the_top_of_tests_holds_only_the_repositorys_own_checks(self):
        loose = {p.name for p in TESTS.glob("*.py")} - {"__init__.py", "conftest.py"}
        assert loose - REPOSITORY_CHECKS == set(), "move each into the folder of what it tests (this module's docstring)"

    def test_every_folder_mirrors_the_tree_or_is_a_suite_or_shared(self):
        folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith((".", "__"))}
        assert {name for name in folders - SUITES - SHARED if not mirrored(name)} == set()

    def test_every_folder_of_test_modules_is_a_package(self):
        """So two test modules of one name in two folders never collide."""
        missing = {
            str(path.parent.relative_to(ROOT))
            for path in TESTS.rglob("test_*.py")
            if not (path.parent / "__init__.py").is_file()
        }
        assert missing == set()

    def test_every_subfolder_mirrors_a_subpackage(self):
        """`tests/core/trimming/` holds the tests of `proxy/core/trimming/`, `tests/demo/echo/` those
        of `proxy/demo/echo/`: below the top, a folder of tests names a package of `proxy/`."""
        strays = {
            str(path.relative_to(ROOT))
            for path in TESTS.glob("*/*/")
            if path.is_dir()
            and not path.name.startswith((".", "__"))
            and path.parent.name not in SUITES | SHARED
            and not (PROXY / path.relative_to(TESTS)).is_dir()
        }
        assert strays == set()

    def test_the_check_tells_a_mirror_from_a_stray(self):
        """Not vacuous: packages, modules and repository folders mirror; other names do not."""
        assert mirrored("wire") and mirrored("cli") and mirrored("bench") and mirrored("deploy")
        assert not mirrored("misc") and not mirrored("tests")
