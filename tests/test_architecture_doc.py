"""The documentation stays true to the tree: docs/architecture.md lists every module under `proxy/`
(and no module that is gone), every relative link in README.md and docs/*.md reaches a file
and, where it names one, a heading of that file; the README keeps the figures' markers and its minimal config loads.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import yaml

from bench import report
from proxy.config.settings import settings_from_dict

ROOT = Path(__file__).parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
MODULE_LINE = re.compile(r"^- `(proxy/[\w/]+\.py)`: \S")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def modules_in_tree() -> set[str]:
    """Every .py file under proxy/, except an `__init__.py` that holds nothing but a docstring."""
    found = set()
    for path in (ROOT / "proxy").rglob("*.py"):
        if path.name == "__init__.py" and not _has_code(path):
            continue
        found.add(path.relative_to(ROOT).as_posix())
    return found


def _has_code(path: Path) -> bool:
    body = ast.parse(path.read_text(encoding="utf-8")).body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return bool(body)


def modules_listed() -> list[str]:
    return [
        m.group(1) for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines() if (m := MODULE_LINE.match(line))
    ]


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        found.add(slug)
    return found


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return [link for link in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", link)]


class TestTheArchitecturePage:
    def test_it_lists_every_module_of_the_tree_and_no_other(self):
        listed = modules_listed()
        tree = modules_in_tree()
        assert sorted(set(listed) - tree) == [], "listed in docs/architecture.md but not in proxy/"
        assert sorted(tree - set(listed)) == [], "in proxy/ but not listed in docs/architecture.md"

    def test_each_module_is_listed_once(self):
        listed = modules_listed()
        assert sorted(m for m in set(listed) if listed.count(m) > 1) == []

    def test_the_rule_counts_a_package_init_with_code_and_skips_one_with_only_a_docstring(self):
        tree = modules_in_tree()
        assert "proxy/state/__init__.py" in tree and "proxy/apis/__init__.py" not in tree
        assert "proxy/core/counting/request_count.py" in tree and "proxy/server/request/perform.py" in tree


class TestTheDocumentationsLinks:
    def test_every_relative_link_reaches_a_file(self):
        broken = []
        for page in pages():
            for link in relative_links(page):
                target = link.split("#", 1)[0]
                if target and not (page.parent / target).exists():
                    broken.append(f"{page.relative_to(ROOT)}: {link}")
        assert broken == []

    def test_every_anchor_names_a_heading_of_its_page(self):
        broken = []
        for page in pages():
            for link in relative_links(page):
                if "#" not in link:
                    continue
                target, anchor = link.split("#", 1)
                linked = (page.parent / target) if target else page
                if linked.suffix == ".md" and linked.exists() and anchor not in anchors(linked):
                    broken.append(f"{page.relative_to(ROOT)}: {link}")
        assert broken == []

    def test_the_pages_do_link(self):
        """The checks above have something to check: the README links to the docs pages."""
        assert {"docs/architecture.md", "docs/operations.md", "docs/configuration.md"} <= set(
            relative_links(ROOT / "README.md")
        )


class TestTheReadme:
    def test_it_keeps_the_markers_make_bench_fills(self):
        text = (ROOT / "README.md").read_text(encoding="utf-8")
        assert text.index(report.README_START) < text.index(report.README_END)

    def test_the_minimal_config_loads_and_sends_claude_models_to_anthropic(self):
        text = (ROOT / "README.md").read_text(encoding="utf-8")
        section = text[text.index("## A minimal config") :]
        (block,) = re.findall(r"```yaml\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)
        settings = settings_from_dict(yaml.safe_load(block), "README.md", {"CONTEXT_GUARD_KEY": "cg-key"})
        first = {
            model: next(r.upstream for r in settings.routes if r.matches(model))
            for model in ("claude-sonnet-4-6", "gpt-4o")
        }
        assert first == {"claude-sonnet-4-6": "anthropic", "gpt-4o": "openai"}
        assert settings.upstreams["anthropic"].kind == "anthropic" and settings.server.client_keys == ("cg-key",)
