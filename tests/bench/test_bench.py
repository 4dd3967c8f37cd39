"""The benchmark's own parts: what its bodies share, what its servers do, what its reports say."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from bench import load, machine, publish, report, rounds
from bench.load import SMALL, Bodies, Connection, HttpxClient, SdkClient, Target
from bench.rounds import Slice, Spread, Throughput
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

    def test_a_warm_request_is_the_warm_body_as_the_objects_an_application_hands_its_sdk(self):
        bodies = Bodies.of_size(25_000)
        first, second = bodies.warm_request(), bodies.warm_request()
        body = orjson.loads(bodies.warm())
        assert first.keys() == body.keys() and first["model"] == body["model"]
        assert first["messages"][:-2] == body["messages"][:-2] == orjson.loads(bodies.base)["messages"]
        assert [m["role"] for m in first["messages"][-2:]] == [m["role"] for m in body["messages"][-2:]]
        assert first["messages"][-1] != second["messages"][-1]

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

    async def test_the_minimal_proxy_also_parses_each_body_and_writes_one_line_and_one_observation(
        self, aiohttp_client: Any, aiohttp_server: Any, capsys: Any
    ):
        upstream = await aiohttp_server(upstream_app())
        client = await aiohttp_client(bare_app(str(upstream.make_url("/v1")), minimal=True))
        body = Bodies.of_size(5_000).base
        for _ in range(2):
            answer = await client.post("/v1/chat/completions", data=body)
            assert await answer.read() == ANSWER
        out = capsys.readouterr().out
        lines = [orjson.loads(line) for line in out.splitlines()]
        assert [line["request_id"] for line in lines] == ["0000000000000000", "0000000000000001"]
        messages = orjson.loads(body)["messages"]
        assert {(line["model"], line["messages"], line["status"]) for line in lines} == {
            ("gpt-4.1", len(messages), 200)
        }
        assert messages[-1]["content"][:40] not in out  # a model's name and counts, never content


def _results(passed: bool = True) -> dict[str, Any]:
    scenario, metric = report.README_ROWS[0]
    row = {"scenario": scenario, "metric": metric, "bare": 2.0, "guard": 3.0, "unit": "ms", "ratio": 1.5}
    row["target"] = "<= 2x"
    row["spread"] = [1.25, 1.5, 1.75]
    untargeted = {**row, "metric": "other", "target": None, "spread": None}
    return {
        "machine_check": {"passed": passed, "reasons": [] if passed else ["the load average was 4.00"]},
        "machine_load": "Machine load: 1-minute load average 0.20 before the run.",
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
        assert "\nold\n" not in readme and readme.startswith("intro\n") and readme.endswith("rest\n")
        line = f"| {report.README_ROWS[0][0]} | {report.README_ROWS[0][1]} | 2.00 ms | 3.00 ms | 1.50x | 1.25 / 1.50 / 1.75 | <= 2x |"
        assert line in readme and line in docs
        assert "1-minute load average 0.20 before the run" in docs and "load average" not in readme
        assert "| other |" not in readme and "| other |" in docs  # the README has the few rows README_ROWS names
        assert "`python bench/run.py --quick`: 1 of its 2 rows" in readme and "2 cores" in docs
        assert "## Changes" in docs and "quality: 200 generated agent conversations" in docs

    def test_the_readmes_figures_are_the_generators_own_rendering_of_the_published_results(self):
        """Never typed by hand: the README's section is what `write_docs` makes of bench/results.json."""
        root = Path(__file__).resolve().parents[2]
        results = orjson.loads((root / "bench/results.json").read_bytes())
        readme = (root / "README.md").read_text(encoding="utf-8")
        start, end = readme.index(report.README_START), readme.index(report.README_END) + len(report.README_END)
        assert readme[start:end] == report.readme_section(results)

    def test_every_row_the_readme_names_is_in_the_published_results(self):
        """A renamed scenario or measure would drop out of the README silently: it is caught here."""
        root = Path(__file__).resolve().parents[2]
        rows = orjson.loads((root / "bench/results.json").read_bytes())["rows"]
        assert len(report.readme_rows(rows)) == len(report.README_ROWS)

    def test_the_sections_other_generators_wrote_are_kept_when_the_page_is_written_again(self, tmp_path: Path):
        (tmp_path / "docs").mkdir()
        (tmp_path / "bench").mkdir()
        (tmp_path / "README.md").write_text(f"{report.README_START}\n{report.README_END}\n")
        families = "<!-- families:start (bench/families.py) -->\n## Families\n| f |\n<!-- families:end -->"
        adversarial = "<!-- adversarial:start (bench/adversarial.py) -->\n## Attacks\n<!-- adversarial:end -->"
        (tmp_path / "docs/benchmarks.md").write_text(f"old figures\n\n{families}\n\n{adversarial}\n")
        report.write_docs(_results(), tmp_path)
        report.write_docs(_results(), tmp_path)  # as `python bench/report.py` does after `make bench`
        docs = (tmp_path / "docs/benchmarks.md").read_text()
        assert "old figures" not in docs and "1-minute load average 0.20" in docs
        assert docs.endswith(f"\n\n{adversarial}\n\n{families}\n") and docs.count("families:start") == 1

    def test_no_docs_are_written_from_a_run_whose_machine_check_did_not_pass(self, tmp_path: Path):
        (tmp_path / "docs").mkdir()
        with pytest.raises(SystemExit, match="quiet-machine check"):
            report.write_docs(_results(passed=False), tmp_path)
        with pytest.raises(SystemExit):
            report.write_docs({k: v for k, v in _results().items() if k != "machine_check"}, tmp_path)
        assert not (tmp_path / "docs/benchmarks.md").exists()

    def test_the_printed_table_has_a_line_per_row(self):
        lines = report.table(_results()).splitlines()
        assert lines[0].startswith("scenario") and len([ln for ln in lines if ln.startswith("start ")]) == 2


def counted_upstream(
    sizes: list[int], chunked: bool = False, status: int = 200, peers: list[object] | None = None
) -> web.Application:
    """The fake upstream's fixed answer, sent chunked or with its length; the size of each body it
    got (and the client's address and port for each, in `peers`)."""

    async def completions(request: web.Request) -> web.StreamResponse:
        sizes.append(len(await request.read()))
        if peers is not None and request.transport is not None:
            peers.append(request.transport.get_extra_info("peername"))
        if not chunked:
            return web.Response(body=ANSWER, status=status, content_type="application/json")
        response = web.StreamResponse(status=status)
        await response.prepare(request)
        for i in range(0, len(ANSWER), 40):
            await response.write(ANSWER[i : i + 40])
        await response.write_eof()
        return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", completions)
    return app


class TestConnection:
    @pytest.mark.parametrize("chunked", [False, True], ids=["with its length", "chunked"])
    async def test_each_post_reads_the_whole_answer_and_the_next_goes_on_the_same_connection(
        self, aiohttp_server: Any, chunked: bool
    ):
        sizes: list[int] = []
        peers: list[object] = []
        server = await aiohttp_server(counted_upstream(sizes, chunked=chunked, peers=peers))
        connection = await Connection.open(str(server.make_url("/v1")))
        try:
            for _ in range(3):
                await connection.post(SMALL)
        finally:
            await connection.close()
        assert sizes == [len(SMALL)] * 3
        assert len(set(peers)) == 1

    async def test_an_answer_other_than_200_is_an_error(self, aiohttp_server: Any):
        server = await aiohttp_server(counted_upstream([], status=503))
        connection = await Connection.open(str(server.make_url("/v1")))
        try:
            with pytest.raises(RuntimeError, match="503"):
                await connection.post(SMALL)
        finally:
            await connection.close()


class TestClosedLoop:
    async def test_a_target_s_rate_and_the_cpu_its_processes_and_the_client_spent_per_request(
        self, aiohttp_server: Any
    ):
        import os

        sizes: list[int] = []
        server = await aiohttp_server(counted_upstream(sizes))
        target = Target("t", str(server.make_url("/v1")), pid=os.getpid())
        got = (await rounds.closed_loop([target], lambda: SMALL, clients=4, seconds=0.3, rounds=2))["t"]
        assert 0 < got.rate <= len(sizes) / 0.5  # two slices of about 0.3 s
        assert got.server_cpu_ms is not None and got.server_cpu_ms > 0 and got.client_cpu_ms > 0
        assert len(got.slices) == 2 and sum(s.requests for s in got.slices) == len(sizes)
        assert all(cpu > 0 for cpu in got.cpu_per_request())


class TestSdkClient:
    async def test_the_openai_sdk_sends_each_request_on_one_kept_connection_and_reads_its_answer(
        self, aiohttp_server: Any
    ):
        bodies: list[bytes] = []
        peers: list[object] = []

        async def completions(request: web.Request) -> web.Response:
            bodies.append(await request.read())
            assert request.transport is not None
            peers.append(request.transport.get_extra_info("peername"))
            return web.Response(body=ANSWER, content_type="application/json")

        app = web.Application(client_max_size=8 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", completions)
        server = await aiohttp_server(app)
        conversation = Bodies.of_size(25_000)
        client = await SdkClient.open(str(server.make_url("/v1")))
        try:
            for _ in range(3):
                await client.post(conversation.warm_request())
        finally:
            await client.close()
        sent = [orjson.loads(b) for b in bodies]
        base = orjson.loads(conversation.base)["messages"]
        assert all(s["messages"][:-2] == base and s["model"] == load.MODEL for s in sent)
        assert len({s["messages"][-1]["content"] for s in sent}) == 3
        assert len(set(peers)) == 1

    @pytest.mark.parametrize("kind", [SdkClient, HttpxClient], ids=["openai SDK", "httpx JSON"])
    async def test_closed_loop_drives_sdk_like_clients_as_it_drives_connections(self, aiohttp_server: Any, kind: Any):
        sizes: list[int] = []
        server = await aiohttp_server(counted_upstream(sizes))
        target = Target("t", str(server.make_url("/v1")))
        conversation = Bodies.of_size(10_000)
        got = await rounds.closed_loop(
            [target], conversation.warm_request, clients=2, seconds=0.3, rounds=1, opener=kind.open
        )
        assert got["t"].slices[0].requests == len(sizes) > 0
        assert min(sizes) > 8_000

    @pytest.mark.parametrize("kind", [SdkClient, HttpxClient], ids=["openai SDK", "httpx JSON"])
    async def test_an_error_answer_raises(self, aiohttp_server: Any, kind: Any):
        server = await aiohttp_server(counted_upstream([], status=400))
        client = await kind.open(str(server.make_url("/v1")))
        try:
            with pytest.raises(Exception, match="400"):
                await client.post(orjson.loads(SMALL))
        finally:
            await client.close()


class TestSmallLatencyWhile:
    async def test_small_requests_are_timed_until_another_process_has_had_that_many_large_bodies_answered(
        self, aiohttp_server: Any
    ):
        sizes: list[int] = []
        server = await aiohttp_server(counted_upstream(sizes))
        target = Target("t", str(server.make_url("/v1")))
        await target.open()
        try:
            times = await load.small_latency_while(target, 200_000, bodies=2)
        finally:
            await target.close()
        large = [s for s in sizes if s > 100_000]
        assert len(times) == sizes.count(len(SMALL)) >= 1
        assert len(large) >= 2


class TestRounds:
    def test_a_spread_is_the_least_median_and_greatest_and_its_range_relative_to_the_median(self):
        spread = Spread.of([1.2, 1.0, 1.5, float("nan")])
        assert spread == Spread(1.0, 1.2, 1.5) and spread.relative == pytest.approx(0.5 / 1.2)
        assert Spread.of([]) is None

    def test_ratios_are_taken_round_by_round(self):
        assert rounds.ratios([2.0, 3.0], [1.0, 2.0]) == [2.0, 1.5]

    def test_a_throughput_pools_its_slices(self):
        got = Throughput((Slice(100, 1.0, 0.2, 0.1), Slice(300, 2.0, 0.3, 0.1)))
        assert got.rate == pytest.approx(400 / 3) and got.server_cpu_ms == pytest.approx(500 / 400)
        assert got.cpu_per_request() == pytest.approx([2.0, 1.0])

    def test_measures_are_cut_into_consecutive_rounds(self):
        assert rounds.chunks([1, 2, 3, 4, 5, 6, 7, 8, 9], 4) == [[1, 2], [3, 4], [5, 6], [7, 8]]


def _watch(load_before: float, other: dict[str, float]) -> machine.Watch:
    watch = machine.Watch(load_before=load_before)
    for name, cores in other.items():
        watch.scenarios[name], watch.seconds[name] = cores, 10.0
    return watch


class TestMachineCheck:
    def test_a_quiet_machine_passes_and_its_load_is_stated(self):
        verdict = machine.judge(_watch(0.3, {"throughput": 0.05}), bare_cpu_spread=0.08)
        assert verdict.passed and verdict.reasons == ()
        assert "load average 0.30" in verdict.sentence() and "passed" in verdict.sentence()

    @pytest.mark.parametrize(
        ("load_before", "other", "spread", "why"),
        [
            (2.5, 0.0, 0.05, "load average was 2.50"),
            (0.2, 0.9, 0.05, "other processes used 0.90 cores"),
            (0.2, 0.0, 0.40, "ranged over 40%"),
        ],
        ids=["busy before", "busy during", "the floor moved"],
    )
    def test_a_busy_machine_is_refused_saying_why(self, load_before, other, spread, why):
        verdict = machine.judge(_watch(load_before, {"throughput": other}), bare_cpu_spread=spread)
        assert not verdict.passed and any(why in reason for reason in verdict.reasons)
        assert "REFUSED" in verdict.sentence()

    def test_other_processes_cpu_is_the_machine_s_busy_time_less_the_benchmark_s_own(self):
        earlier, later = machine.Sample(0.0, 100.0, 40.0), machine.Sample(10.0, 112.0, 49.0)
        assert later.other_cores_since(earlier) == pytest.approx(0.3)

    def test_the_readings_come_from_this_machine(self):
        sample = machine.Sample.now()
        assert machine.load_average() >= 0 and sample.busy > 0 and sample.ours > 0


class TestPublish:
    def test_a_passed_run_writes_its_results_and_docs(self, tmp_path: Path, capsys):
        (tmp_path / "docs").mkdir()
        (tmp_path / "README.md").write_text(f"{report.README_START}\nold\n{report.README_END}\n")
        out = tmp_path / "results.json"
        assert publish.publish(_results(), tmp_path, out, docs=True, force_print=False) == 0
        assert out.exists() and (tmp_path / "docs/benchmarks.md").exists()

    @pytest.mark.parametrize("force_print", [False, True])
    def test_a_refused_run_writes_no_docs_and_exits_non_zero_unless_forced(self, tmp_path: Path, capsys, force_print):
        (tmp_path / "README.md").write_text(f"{report.README_START}\nold\n{report.README_END}\n")
        out = tmp_path / "results.json"
        status = publish.publish(_results(passed=False), tmp_path, out, docs=True, force_print=force_print)
        assert status == (0 if force_print else publish.REFUSED_STATUS)
        assert not out.exists() and not (tmp_path / "docs").exists() and "old" in (tmp_path / "README.md").read_text()
        assert (tmp_path / "results-refused.json").exists()
        assert "the load average was 4.00" in capsys.readouterr().out


class TestCapacityReadsTheRun:
    def test_the_warm_rate_is_the_new_turn_s_when_the_run_also_sent_the_body_again(self):
        from bench import capacity

        def row(scenario: str, metric: str, guard: float) -> dict[str, Any]:
            return {"scenario": scenario, "metric": metric, "bare": 600.0, "guard": guard, "unit": "req/s"}

        rows = [
            row("throughput, 32 clients, 88 KB cold", "req/s, one worker", 250.0),
            row("throughput, 32 clients, 88 KB warm, same body", "req/s, one worker", 900.0),
            row("throughput, 32 clients, 88 KB warm, new turn", "req/s, one worker", 500.0),
            row("memory", "RSS after 1,000 requests (25 KB, cold)", 150.0),
        ]
        assert capacity.measured({"machine": "2 cores", "rows": rows}).rps_warm == 500.0


class TestFootprint:
    def test_a_request_counts_each_function_it_ran_once_and_every_call(self):
        from bench.footprint import RequestFootprint

        def start() -> None:  # what a server calls once per request
            pass

        def helper(n: int) -> int:
            return n + len("x")

        hook = RequestFootprint(start.__code__)
        sys.setprofile(hook)
        try:
            for calls in (3, 1):  # two requests: the helper three times, then once
                start()
                for i in range(calls):
                    helper(i)
            start()  # the next request begins: the second one is complete
        finally:
            sys.setprofile(None)
        first, second = hook.requests
        assert first[0] == second[0] == 2  # `start` and `helper`, however often each ran
        assert first[1] == second[1] == 1  # `len`
        assert first[2] - second[2] == 2 * 2  # two more `helper` calls, each with its `len`
        assert hook.medians()[0] == 2

    def test_a_longer_conversation_of_the_same_size_has_fewer_messages(self):
        usual, longer = (orjson.loads(Bodies.of_size(88_000, longer=n).base)["messages"] for n in (1, 4))
        assert len(longer) * 3 < len(usual)
        assert [m["role"] for m in longer[:5]] == [m["role"] for m in usual[:5]]


class TestSpreadsOfTheSingleRunRows:
    def test_the_sse_gap_s_spread_is_the_guard_s_added_p99_over_the_bare_proxy_s_round_by_round(self):
        from bench.scenarios import gap_spread

        def streams(extra_ms: float) -> list[load.StreamTiming]:  # eight streams, a round of two each
            return [load.StreamTiming(0.001, [0.020 + extra_ms / 1000] * 63) for _ in range(8)]

        timings = {"upstream": streams(0), "bare": streams(0.25), "guard": streams(0.30)}
        spread = gap_spread(timings, 4)
        assert spread is not None and spread.low == pytest.approx(1.2) and spread.high == pytest.approx(1.2)

    def test_the_counting_ratios_are_the_median_of_their_rounds_with_their_spread(self):
        from bench import core_speed

        figures = {
            "counting": {
                "tokens": 1000,
                "messages": 4,
                "text_mb": 0.1,
                "raw_encode_s": 0.4,
                "cold_one_thread_s": 0.5,
                "cold_ratios": [0.79, 0.84, 0.81],
                "cold_pool_s": 0.4,
                "pool_gains": [1.3, 1.4, 1.2],
                "warm_s": 0.02,
                "warm_speedup": 25.0,
            },
            "trim_heavy": {
                "tokens_before": 10,
                "tokens_after": 5,
                "messages": 2,
                "window": 8,
                **{f"{phase}_ms": 1.0 for phase in ("parse", "count", "decide", "serialise")},
            },
        }
        cold, pool = core_speed.rows(figures)[:2]
        assert cold["ratio"] == 0.81 and cold["spread"] == [0.79, 0.81, 0.84]
        assert pool["ratio"] == 1.3 and pool["spread"] == [1.2, 1.3, 1.4]
