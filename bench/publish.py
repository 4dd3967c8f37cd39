"""What a run may write: everything from a run the quiet-machine check passed, nothing from one it
refused.

A passed run writes bench/results.json, docs/benchmarks.md and the README's figures (between its
markers: bench/report.py). A refused run (bench/machine.py says why) prints its table and the
reasons, writes its results beside the published ones as bench/results-refused.json (for a look,
never for the docs: bench/report.py will not render a refused run either) and exits with status 3,
unless `--force-print` asked for the figures anyway, which still writes no docs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from bench import report

REFUSED_STATUS = 3


def refused_path(out: Path) -> Path:
    return out.with_name(out.stem + "-refused" + out.suffix)


def publish(results: dict[str, Any], root: Path, out: Path, *, docs: bool, force_print: bool) -> int:
    """Print the run, write what it may write; the exit status."""
    print(report.table(results))
    check = results["machine_check"]
    if not check["passed"]:
        report.write_json(results, refused_path(out))
        print(
            "\nNot published: the machine was too busy to measure on ("
            + "; ".join(check["reasons"])
            + f"). README.md, docs/benchmarks.md and {out.name} are unchanged; this run's results are in "
            + f"{refused_path(out).name}. Rerun on a quiet machine."
        )
        return 0 if force_print else REFUSED_STATUS
    report.write_json(results, out)
    if docs:
        report.write_docs(results, root)
    return 0


def write_section(path: Path, text: str, start: str, end: str) -> None:
    """Put `text` (which opens with `start` and closes with `end`) in place of that section of the
    page at `path`, or after its end when the page has none yet: how bench/adversarial.py,
    bench/agents.py and bench/families.py each write their own section of docs/benchmarks.md."""
    current = path.read_text(encoding="utf-8") if path.is_file() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.DOTALL)
    if pattern.search(current):
        current = pattern.sub(lambda _: text, current)
    else:
        current = current.rstrip() + "\n\n" + text + "\n"
    path.write_text(current, encoding="utf-8")
