"""The page as a person sees it: a real headless Chromium opens it on a real proxy after real traffic.

Chromium comes from the system's packages (`scripts/install-components.sh` installs it); without it
these tests skip. The screenshot is written under the test's tmp dir, and copied to
$CONTEXT_GUARD_ARTIFACTS when that is set, for a person to look at.
"""

from __future__ import annotations

import asyncio
import contextlib
import html.parser
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from proxy.server.observation.page import PAGE_PATH
from tests.server.conftest import long_conversation
from tests.support.page_traffic import SECRET_WORDS, chat, make_every_kind, make_traffic

pytestmark = pytest.mark.components

BROWSER_SECONDS = 60.0


def chromium() -> str:
    for name in ("chromium", "chromium-browser"):
        if path := shutil.which(name):
            return path
    pytest.skip("chromium is not installed (scripts/install-components.sh installs it)")


async def run_chromium(profile: Path, *args: str) -> str:
    """Chromium headless with one task (`--dump-dom` or `--screenshot=`); its stdout. Always ends it."""
    process = await asyncio.create_subprocess_exec(
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--window-size=1400,900",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        out, _ = await asyncio.wait_for(process.communicate(), BROWSER_SECONDS)
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    assert process.returncode == 0, f"chromium exited with {process.returncode}"
    return out.decode("utf-8", "replace")


class VisibleRows(html.parser.HTMLParser):
    """The decisions table as text, one list of cell texts per row, read from the DOM Chromium built."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.bars: list[dict[str, float]] = []  # per bar: the widths of before and after, the budget's offset, in %
        self._cell: list[str] | None = None
        self._in_decisions = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        classes = (dict(attrs).get("class") or "").split()
        if tag == "table" and dict(attrs).get("id") == "decisions":
            self._in_decisions = True
        elif self._in_decisions and tag == "tr" and "decision" in classes:
            self.rows.append([])
        elif self._in_decisions and tag == "td" and self.rows:
            self._cell = []
        elif tag == "div" and "bar" in classes:
            self.bars.append({})
        elif tag == "span" and self.bars and classes and classes[0] in ("before", "after", "budget"):
            self.bars[-1][classes[0]] = float(re.findall(r"([\d.]+)%", dict(attrs).get("style") or "")[0])

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None and self.rows:
            self.rows[-1].append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "table":
            self._in_decisions = False

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data + " ")


def visible_rows(dom: str) -> VisibleRows:
    parser = VisibleRows()
    parser.feed(dom)
    return parser


def keep_artifact(path: Path) -> None:
    if target := os.environ.get("CONTEXT_GUARD_ARTIFACTS"):
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / path.name)


class TestThePageInABrowser:
    async def test_a_person_sees_every_decision_with_its_numbers_and_bar(self, proxy: Any, tmp_path: Path) -> None:
        expected = await make_traffic(proxy)
        url = str(proxy.make_url(PAGE_PATH))
        dom = await run_chromium(tmp_path / "profile", "--dump-dom", url)
        seen = visible_rows(dom)
        assert [row[1] for row in seen.rows] == list(reversed(expected))  # request ids, newest first
        assert [row[3].split()[0] for row in seen.rows] == list(reversed(expected.values()))  # outcomes
        assert len(seen.bars) == 5 and SECRET_WORDS not in dom
        for row, bar in zip(seen.rows, seen.bars, strict=True):
            if row[3] == "trimmed":  # the solid part is shorter than the pale one and ends before the budget line
                assert bar["after"] < bar["before"] == 100.0 and bar["after"] <= bar["budget"]
            if row[3] == "rejected":
                assert bar["after"] == bar["before"] == 100.0 > bar["budget"]
        trimmed = seen.rows[-1]
        assert "→" in trimmed[5] and "/ 6,554" in trimmed[5]  # before → after / budget, for gpt-4
        assert "drop_oldest_turns" in trimmed[6] and "removed" in trimmed[6]

    async def test_the_outcome_filter_in_the_url_shows_only_trimmed_requests(self, proxy: Any, tmp_path: Path) -> None:
        await make_traffic(proxy)
        url = str(proxy.make_url(f"{PAGE_PATH}?outcome=trimmed"))
        seen = visible_rows(await run_chromium(tmp_path / "profile", "--dump-dom", url))
        assert [(row[1], row[3]) for row in seen.rows] == [("trim-2", "trimmed"), ("trim-1", "trimmed")]

    async def test_a_screenshot_is_kept_for_a_person_to_look_at(
        self, proxy: Any, upstream: Any, tmp_path: Path
    ) -> None:
        await make_traffic(proxy)
        upstream.limit = 6000  # the upstream counts higher than we do: the proxy learns a tighter window
        assert await chat(proxy, {"model": "gpt-4", "messages": long_conversation()}, "corrected-1") == 200
        screenshot = tmp_path / "recent-decisions.png"
        await run_chromium(tmp_path / "profile", f"--screenshot={screenshot}", str(proxy.make_url(PAGE_PATH)))
        data = screenshot.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000  # a rendered page, not a blank one
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        assert (width, height) == (1400, 900)
        keep_artifact(screenshot)


class TestEveryKindOfDecisionInABrowser:
    async def test_each_row_says_what_happened_and_what_a_removed_run_held(self, proxy: Any, tmp_path: Path) -> None:
        """A trimmed stream, cleared tool results, a refused body and a count answered here, as
        Chromium renders the page: outcome, model, and for a cut what each run held (roles, tools)."""
        expected = await make_every_kind(proxy)
        dom = await run_chromium(tmp_path / "profile", "--dump-dom", str(proxy.make_url(PAGE_PATH)))
        rows = {row[1]: row for row in visible_rows(dom).rows}
        assert {rid: row[3].split()[0] for rid, row in rows.items()} == expected
        trimmed, cleared, refused, counted = (rows[rid] for rid in expected)
        assert "streamed" in trimmed[3] and "drop_oldest_turns" in trimmed[6]
        assert re.search(r"messages \d+-\d+: \d+ dropped \(removed whole\).*held \d+ user, \d+ assistant messages", trimmed[6])
        cleared_run = re.search(r"messages 3-\d+, (\d+) of them: \1 cleared \(a placeholder left in its place\)", cleared[6])
        assert cleared_run and "clear_tool_results" in cleared[6]
        half = int(cleared_run.group(1)) // 2  # every other result: run_tests, then read_file
        assert f"held {2 * half} tool messages; tools: run_tests ({half}), read_file ({half})" in cleared[6]
        assert refused[2].startswith("gpt-4o") and refused[4] == "400" and "invalid_request" in refused[3]
        assert counted[2].startswith("claude-sonnet-4-6") and "tokens counted" in counted[5]
        assert "answered by the guard, not forwarded" in counted[6] and "removed" not in counted[6]
        assert SECRET_WORDS not in dom and "PASSED tests" not in dom

    async def test_a_screenshot_of_every_kind_is_produced(self, proxy: Any, tmp_path: Path) -> None:
        await make_every_kind(proxy)
        screenshot = tmp_path / "every-kind-of-decision.png"
        await run_chromium(tmp_path / "profile", f"--screenshot={screenshot}", str(proxy.make_url(PAGE_PATH)))
        data = screenshot.read_bytes()
        assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 20_000
        keep_artifact(screenshot)
