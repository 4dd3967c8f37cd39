"""Per-request work that depends on nothing in the request: ids from a counter, routes worked out once."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from proxy.errors import ModelNotRouted
from proxy.server.backends.models import Router
from proxy.server.backends.profiles import forwardable_request_id, profile_for
from proxy.server.request.flow import RequestIds, new_request_id, request_id_of
from tests.server.conftest import gateway_settings

ROOT = Path(__file__).parents[3]


class TestRequestIds:
    def test_an_id_is_32_hex_digits_that_read_as_a_version_4_uuid(self):
        value = new_request_id()
        parsed = uuid.UUID(value)
        assert len(value) == 32 and parsed.version == 4 and parsed.variant == uuid.RFC_4122

    def test_ids_of_one_process_never_repeat(self):
        ids = RequestIds()
        assert len({ids.next() for _ in range(10_000)}) == 10_000

    def test_two_processes_share_no_id(self):
        """Each process (a spawned worker, a replica) draws its own prefix at start."""
        code = "from proxy.server.request.flow import new_request_id as n; print(n(), n())"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        runs = [
            subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
            for _ in range(2)
        ]
        first, second = (set(run.stdout.split()) for run in runs)
        assert len(first) == len(second) == 2 and not first & second

    @pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
    def test_a_forked_child_draws_a_prefix_of_its_own(self):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: its next id, to the parent
            os.write(write, new_request_id().encode())
            os._exit(0)
        os.waitpid(pid, 0)
        child = os.read(read, 64).decode()
        assert child[:16] != new_request_id()[:16]

    def test_a_request_without_a_usable_id_gets_one_an_upstream_taking_only_uuids_accepts(self):
        made = request_id_of("has a space")
        assert forwardable_request_id(profile_for("llamacpp"), made)


class TestRouter:
    def settings(self):
        return gateway_settings(
            "http://127.0.0.1:9/v1",
            routes=[
                {"match": "gpt-4o", "upstream": "fake", "rename": "served"},
                {"match": "claude-*", "upstream": "fake"},
            ],
        )

    def test_a_model_is_routed_once_and_its_target_reused(self, monkeypatch):
        router = Router(self.settings())
        tried: list[str] = []
        original = type(router.routes[0]).matches
        monkeypatch.setattr(
            type(router.routes[0]), "matches", lambda route, model: tried.append(model) or original(route, model)
        )
        first = router.route("claude-3")
        assert router.route("claude-3") is first and first.model == "claude-3"
        assert tried == ["claude-3", "claude-3"]  # two routes tried, on the first request only
        assert router.route("gpt-4o").model == "served"

    def test_an_unrouted_model_is_refused_every_time(self):
        router = Router(self.settings())
        for _ in range(2):
            with pytest.raises(ModelNotRouted):
                router.route("llama-3")

    def test_past_its_bound_a_model_is_routed_afresh_and_not_kept(self):
        router = Router(self.settings())
        router.MAX_ROUTED = 3
        for i in range(5):
            assert router.route(f"claude-{i}").model == f"claude-{i}"
        assert len(router._routed) == 3
