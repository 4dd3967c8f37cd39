"""Gemini's other endpoints through the guard with google-genai: caches (create, get, list,
update, delete), files and model listings reach the configured Gemini or Vertex AI upstream with
its credential and under the path google-genai wrote (its version prefix kept: google-genai 3.6
sends `/v1/cachedContents`, on Vertex AI `/v1beta1/projects/{p}/locations/{l}/cachedContents`),
routed by the model however Google spells it, beside an OpenAI upstream that takes everything
else."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from google import genai
from google.genai import errors, types
from google.oauth2.credentials import Credentials

from proxy.config.settings import settings_from_dict
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.support.gemini_upstream import FakeGemini

FLASH = "gemini-2.5-flash"
VERTEX_BASE = "{root}/v1/projects/my-project/locations/us-central1/endpoints/openapi"
CACHED = types.CreateCachedContentConfig(contents=["a long document " * 20], ttl="600s")


@pytest.fixture
async def google(aiohttp_server: Any) -> tuple[FakeGemini, str]:
    provider = FakeGemini()
    server = await aiohttp_server(provider.app())
    return provider, str(server.make_url("")).rstrip("/")


async def guard_for(aiohttp_server: Any, model_map: Any, google_upstream: dict[str, Any], other: str) -> str:
    data = {
        "upstreams": {
            "google": {"read_timeout": 10, "connect_timeout": 2, **google_upstream},
            "openai": {"base_url": f"{other}/v1", "kind": "openai", "api_key_env": "OPENAI_KEY"},
        },
        "routes": [{"match": "gemini-*", "upstream": "google"}, {"match": "*", "upstream": "openai"}],
    }
    settings = settings_from_dict(data, "test.yaml", {"GEMINI_KEY": "server-key", "OPENAI_KEY": "sk-openai"})
    server: TestServer = await aiohttp_server(create_app(settings, Models(settings, model_map)))
    return str(server.make_url("")).rstrip("/")


@pytest.fixture(params=["developer", "vertex"])
async def client(
    request: Any, google: Any, aiohttp_server: Any, model_map: Any, monkeypatch: pytest.MonkeyPatch
) -> genai.Client:
    return await _client(request.param, request, google, aiohttp_server, model_map, monkeypatch)


@pytest.fixture
async def developer_client(
    request: Any, google: Any, aiohttp_server: Any, model_map: Any, monkeypatch: pytest.MonkeyPatch
) -> genai.Client:
    """The Developer API's client alone: Vertex AI has no files API."""
    return await _client("developer", request, google, aiohttp_server, model_map, monkeypatch)


async def _client(
    kind: str, request: Any, google: Any, aiohttp_server: Any, model_map: Any, monkeypatch: pytest.MonkeyPatch
) -> genai.Client:
    monkeypatch.setenv("GEMINI_KEY", "server-key")
    _, root = google
    other = FakeGemini()  # the catch-all (OpenAI) upstream: it records what reaches it, and nothing of Google's should
    other_server = await aiohttp_server(other.app())
    other_root = str(other_server.make_url("")).rstrip("/")
    request.node.other = other
    if kind == "developer":
        upstream = {"base_url": root, "kind": "gemini", "api_key_env": "GEMINI_KEY"}
        url = await guard_for(aiohttp_server, model_map, upstream, other_root)
        return genai.Client(api_key="client-key", http_options=types.HttpOptions(base_url=url))
    upstream = {"base_url": VERTEX_BASE.format(root=root), "kind": "vertex", "token_command": "printf vertex-token"}
    url = await guard_for(aiohttp_server, model_map, upstream, other_root)
    credentials = Credentials(token="client-token")
    return genai.Client(vertexai=True, project="my-project", location="us-central1", credentials=credentials,
                        http_options=types.HttpOptions(base_url=url))  # fmt: skip


def credential_of(received: Any) -> str:
    return received.headers.get("x-goog-api-key") or received.headers.get("Authorization", "")


class TestCachedContents:
    async def test_a_cache_is_created_read_listed_updated_and_deleted_on_the_google_upstream(
        self, client, google, request
    ):
        provider, _ = google
        created = await client.aio.caches.create(model=FLASH, config=CACHED)
        assert created.name in provider.caches
        assert (await client.aio.caches.get(name=created.name)).name == created.name
        assert [c.name async for c in await client.aio.caches.list()] == [created.name]
        await client.aio.caches.update(name=created.name, config=types.UpdateCachedContentConfig(ttl="60s"))
        await client.aio.caches.delete(name=created.name)
        assert provider.caches == {}
        methods = [(r.method, r.path.rpartition("/cachedContents")[0]) for r in provider.received]
        assert [m for m, _ in methods] == ["POST", "GET", "GET", "PATCH", "DELETE"]
        assert {prefix for _, prefix in methods} <= {"/v1", "/v1beta1/projects/my-project/locations/us-central1"}
        assert {credential_of(r) for r in provider.received} <= {"server-key", "Bearer vertex-token"}
        assert request.node.other.received == []  # the OpenAI upstream saw none of it

    async def test_the_model_in_the_body_is_routed_however_google_spells_it(self, client, google, request):
        """`models/gemini-2.5-flash` (Developer API) and `projects/.../models/gemini-2.5-flash` (Vertex AI) match `gemini-*`."""
        provider, _ = google
        await client.aio.caches.create(model=FLASH, config=CACHED)
        spelled = provider.received[-1].json()["model"]
        assert spelled.endswith(f"models/{FLASH}") and spelled != FLASH
        assert request.node.other.received == []


class TestListings:
    async def test_models_are_listed_by_the_google_upstream(self, client, google, request):
        provider, _ = google
        listed = [m.name async for m in await client.aio.models.list()]
        assert listed == ["models/gemini-2.5-flash"]
        assert provider.received[-1].method == "GET" and request.node.other.received == []

    async def test_files_are_listed_by_the_google_upstream_on_the_developer_api(
        self, developer_client, google, request
    ):
        provider, _ = google
        assert [f async for f in await developer_client.aio.files.list()] == []
        assert provider.received[-1].path == "/v1/files" and request.node.other.received == []


class TestWhatDoesNotPass:
    async def test_batch_generation_is_refused_in_google_s_shape_and_reaches_no_upstream(self, client, google, request):
        provider, _ = google
        with pytest.raises(errors.ClientError) as refused:  # the SDK's own request path, as `batches.create` uses it
            await client.aio.models._api_client.async_request(
                "post", f"models/{FLASH}:batchGenerateContent", {"requests": []}, None
            )
        assert refused.value.code == 404 and refused.value.status == "NOT_FOUND"
        assert "batchGenerateContent" in refused.value.message
        assert provider.received == [] and request.node.other.received == []


class TestWithoutAGoogleUpstream:
    async def test_google_genai_prints_what_the_guard_refused_not_404_none(self, aiohttp_server, model_map):
        other = FakeGemini()
        other_root = str((await aiohttp_server(other.app())).make_url("")).rstrip("/")
        data = {"upstreams": {"openai": {"base_url": f"{other_root}/v1", "kind": "openai"}}}
        settings = settings_from_dict(data, "test.yaml", {})
        server: TestServer = await aiohttp_server(create_app(settings, Models(settings, model_map)))
        options = types.HttpOptions(base_url=str(server.make_url("")).rstrip("/"))
        google = genai.Client(api_key="client-key", http_options=options)
        with pytest.raises(errors.ClientError) as refused:
            await google.aio.caches.list()
        assert refused.value.code == 404 and refused.value.status == "NOT_FOUND"
        assert "/v1/cachedContents" in refused.value.message and "not Google's" in refused.value.message
        assert other.received == []
