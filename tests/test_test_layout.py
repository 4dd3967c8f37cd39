"""The suite's own layout: what tests share lives in support modules (`tests/support/`, a
directory's helper module such as `tests/core/trimming.py`, or a `conftest.py`), never in a test
module another file imports. A test module then holds only its specification, and running or
deleting one never changes another."""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
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
            "from tests.core.test_turns import call",
            "import tests.core.test_turns",
            "from tests.core import test_turns",
            "from .test_turns import call",
            "def f():\n    from tests.core.test_turns import call",
        ):
            assert any(map(is_test_module, imported_modules(source, "tests.core"))), source
        for source in ("from tests.core.trimming import call", "from aiohttp.test_utils import TestServer"):
            assert not any(map(is_test_module, imported_modules(source, "tests.core"))), source
        assert IMPORT_IN_TEXT.search('script = "from tests.core.test_turns import call"')
        assert not IMPORT_IN_TEXT.search('script = "from tests.core.trimming import call"')
