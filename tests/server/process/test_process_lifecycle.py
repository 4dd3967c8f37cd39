"""`context-guard serve` as a real process: a busy port, and a SIGTERM while a stream runs."""

from __future__ import annotations

import asyncio
import signal
import socket

import aiohttp
import pytest

from tests.support.processes import Guard

STREAM = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_a_busy_port_is_one_log_line_and_exit_status_2(tmp_path, upstream, workers):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        guard = Guard("busy", port, tmp_path, "--upstream", upstream.url, "--workers", workers).start()
        try:
            assert await guard.exited(60) == 2
        finally:
            guard.kill()
    assert "Traceback" not in guard.output
    [line] = guard.events("cannot_listen")
    assert line["port"] == port and line["reason"] == "Address already in use" and line["level"] == "error"


async def test_sigterm_finishes_the_stream_in_flight_then_exits_0_saying_what_it_drained(tmp_path, upstream):
    upstream.chunk_delay, upstream.stream_chunks = 0.1, 30  # a 3 s stream
    guard = Guard(
        "drain", 0, tmp_path, "--upstream", upstream.url, "--workers", "1", "--drain-delay", "1"
    ).start()
    try:
        await guard.until_ready()
        async with aiohttp.ClientSession() as session:
            async with session.post(guard.url("/v1/chat/completions"), json=STREAM) as stream:
                await asyncio.wait_for(upstream.stream_started.wait(), 10)
                guard.signal(signal.SIGTERM)
                await guard.logged("draining")  # it still listens for the drain delay, no longer ready
                async with session.get(guard.url("/readyz")) as ready:  # still listening, no longer ready
                    assert ready.status == 503 and (await ready.json())["reasons"] == ["draining: shutting down"]
                body = (await stream.read()).decode()
        assert stream.status == 200 and body.count("part") == 30 and body.endswith("data: [DONE]\n\n")
        assert await guard.exited(30) == 0
    finally:
        guard.kill()
    [stopped] = guard.events("stopped")
    assert stopped["signal"] == "SIGTERM" and stopped["worker"] == 1
    assert stopped["in_flight_at_close"] == 1 and stopped["completed_after_close"] == 1 and stopped["cancelled"] == 0


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_a_configured_vocabulary_that_does_not_load_stops_the_start_with_exit_status_2(
    tmp_path, upstream, workers
):
    from proxy.tokenizers.vocabularies import encoding_file_name

    encodings = tmp_path / "encodings"
    encodings.mkdir()
    (encodings / encoding_file_name("o200k_base")).write_bytes(b"bm90IGEgdm9jYWJ1bGFyeQ== 0\n")
    config = tmp_path / "cg.yaml"
    config.write_text(
        f"tokenizers:\n  encodings_dir: {encodings}\n"
        f"upstreams:\n  up:\n    base_url: {upstream.url}\nroutes:\n  - match: gpt-4o\n    upstream: up\n"
    )
    guard = Guard("corrupt", 0, tmp_path, "--config", str(config), "--workers", workers).start()
    try:
        assert await guard.exited(60) == 2
    finally:
        guard.kill()
    assert "Traceback" not in guard.output
    lines = guard.events("cannot_start")  # one per worker that got that far
    assert lines and all("o200k_base" in e["reason"] and "SHA-256 differs" in e["reason"] for e in lines)
