"""The route tables remember only what passed the client-key check, and evict.

Keyless requests refused 401, each to a new path or naming a new model, leave both tables as
they were; the path table, once full, keeps the newest routes (the oldest evicted), so no client
can fill a table for good and make every later request slower.
"""

from __future__ import annotations

import json

from proxy.server.process.app import ROUTES_KEPT
from proxy.server.request.gateway import GATEWAY
from tests.adversarial.conftest import body_of, get, post

KEY = {"Authorization": "Bearer good-key"}


async def test_unauthenticated_requests_leave_the_route_tables_as_they_were(serve_guard, settings):
    guard = await serve_guard(settings(server={"client_keys": ["good-key"]}))
    assert guard.app is not None
    gateway = guard.app[GATEWAY]
    before = dict(gateway.routes), len(gateway.model_routes)
    for i in range(ROUTES_KEPT + 44):  # keyless, each to a new path or naming a new model
        status, _, _ = await get(guard.url(f"/v1/models/m{i}"))
        assert status == 401
        status, _, _ = await post(guard.url("/v1/chat/completions"), body_of("hi", model=f"gpt-4o-{i}"))
        assert status == 401
    assert (dict(gateway.routes), len(gateway.model_routes)) == before


async def test_a_full_table_keeps_the_newest_routes(serve_guard, settings):
    guard = await serve_guard(settings(server={"client_keys": ["good-key"]}))
    assert guard.app is not None
    for i in range(ROUTES_KEPT + 10):
        status, _, _ = await get(guard.url(f"/v1/models/m{i}"), KEY)
        assert status < 500
    status, answer, _ = await post(guard.url("/v1/chat/completions"), body_of("hi"), KEY)
    assert status == 200 and json.loads(answer)["object"] == "chat.completion"
    routes = guard.app[GATEWAY].routes
    assert len(routes) == ROUTES_KEPT and ("/v1/chat/completions", "POST") in routes
