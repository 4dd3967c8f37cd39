"""The benchmark's own parts: what its bodies share, what its servers do, what its reports say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from bench import report
from bench.load import Bodies
from bench.servers import ANSWER, DONE, bare_app, upstream_app


class TestBodies:
    def test_two_cold_bodies_share_no_message(self):
        bodies = Bodies.of_size(25_000)
        first, second = (orjson.loads(bodies.cold())["messages"] for _ in range(2))
        assert not {orjson.dumps(m) for m in first} & {orjson.dumps(m) for m in second}

    def test_a_warm_body_is_the_base_conversation_plus_one_new_turn(self):
        bodies = Bodies.of_size(25_000)
        base = orjson.loads(bodies.base)["messages"]
        first, second = (orjson.loads(bodies.warm())["messages"] for _ in range(2))
        assert first[: len(base)] == second[: len(base)] == base
        assert len(first) == len(base) + 2 and first[-1] != second[-1]

    def test_a_body_is_about_the_size_asked_for(self):
        assert 20_000 < len(Bodies.of_size(25_000).cold()) < 32_000


class TestServers:
    async def test_the_fake_upstream_answers_a_fixed_completion_or_paced_deltas(self, aiohttp_client: Any):
        client = await aiohttp_client(upstream_app())
        plain = await client.post("/v1/chat/completions", data=b"{}")
        assert await plain.read() == ANSWER
        streamed = await (await client.post("/v1/chat/completions?deltas=3&gap_ms=1", data=b"{}")).read()
        assert streamed.count(b"data: ") == 4 and streamed.endswith(DONE)

    async def test_the_bare_proxy_forwards_the_body_and_streams_the_answer_back(
        self, aiohttp_client: Any, aiohttp_server: Any
    ):
        upstream = await aiohttp_server(upstream_app())
        client = await aiohttp_client(bare_app(str(upstream.make_url("/v1"))))
        answer = await client.post("/v1/chat/completions?bytes=200000", data=b"{}")
        assert answer.status == 200
        assert len(await answer.read()) > 200_000 - 64 * 1024


def _results() -> dict[str, Any]:
    row = {"scenario": "s", "metric": "m", "bare": 2.0, "guard": 3.0, "unit": "ms", "ratio": 1.5, "target": "<= 2x"}
    untargeted = {**row, "metric": "other", "target": None}
    return {
        "command": "python bench/run.py --quick",
        "machine": "2 cores",
        "date": "2026-01-01 00:00 UTC",
        "seconds": 120,
        "workers_measured": False,
        "rows": [row, untargeted],
        "trimming_quality": "quality: 200 generated agent conversations",
    }


class TestReport:
    def test_the_docs_and_the_readme_section_are_written_from_the_results_with_their_provenance(self, tmp_path: Path):
        (tmp_path / "docs").mkdir()
        (tmp_path / "bench").mkdir()
        (tmp_path / "bench/changes.md").write_text("## Changes\n")
        (tmp_path / "README.md").write_text(f"intro\n{report.README_START}\nold\n{report.README_END}\nrest\n")
        report.write_docs(_results(), tmp_path)
        readme = (tmp_path / "README.md").read_text()
        docs = (tmp_path / "docs/benchmarks.md").read_text()
        assert "old" not in readme and readme.startswith("intro\n") and readme.endswith("rest\n")
        assert "| s | m | 2.00 ms | 3.00 ms | 1.50x | <= 2x |" in readme
        assert "other" not in readme and "other" in docs
        assert "`python bench/run.py --quick`" in readme and "2 cores" in docs
        assert "## Changes" in docs and "quality: 200 generated agent conversations" in docs

    def test_the_printed_table_has_a_line_per_row(self):
        lines = report.table(_results()).splitlines()
        assert lines[0].startswith("scenario") and len([ln for ln in lines if ln.startswith("s ")]) == 2
