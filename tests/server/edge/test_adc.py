"""A Vertex AI upstream with `auth: adc` gets its bearer token from Google's Application Default
Credentials (proxy.server.edge.adc), through the real google-auth, against a local token endpoint: an
in-process OAuth token server for a service-account file whose `token_uri` points at it (its key
generated here), and a metadata server standing in for GKE's and Cloud Run's."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from proxy.config.schema import SchemaError
from proxy.config.upstreams import UpstreamSettings
from proxy.errors import UpstreamUnavailable
from proxy.server.edge import adc
from proxy.server.edge.credentials import UpstreamAuth
from tests.server.conftest import gateway_settings

CHAT = {"model": "gemini-2.5-pro", "messages": [{"role": "user", "content": "hi"}]}
EMAIL = "guard@project.iam.gserviceaccount.com"


def _unb64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


class TokenServer:
    """Google's OAuth token endpoint for one service account: checks the signed JWT assertion
    with the account's public key and answers a new access token each time, valid an hour.
    `hold` keeps answers waiting until it is set, so that requests can pile up behind a refresh."""

    def __init__(self, public_key: rsa.RSAPublicKey) -> None:
        self.public_key = public_key
        self.issued: list[str] = []
        self.asked = asyncio.Event()
        self.hold = asyncio.Event()
        self.hold.set()
        self.failures = 0  # answers to refuse (400 invalid_grant) before the next token
        self.url = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/token", self.token)
        return app

    async def token(self, request: web.Request) -> web.Response:
        form = await request.post()
        if form["grant_type"] == "refresh_token":  # gcloud's user credentials
            assert (form["client_id"], form["client_secret"], form["refresh_token"]) == ("cid", "csecret", "1//refresh")
        else:
            assert form["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
            header, claims, signature = str(form["assertion"]).split(".")
            self.public_key.verify(_unb64(signature), f"{header}.{claims}".encode(), padding.PKCS1v15(), hashes.SHA256())
            payload = json.loads(_unb64(claims))
            assert (payload["iss"], payload["aud"]) == (EMAIL, "https://oauth2.googleapis.com/token")  # google-auth's
            assert adc.CLOUD_PLATFORM in payload["scope"].split()
        self.asked.set()
        await self.hold.wait()
        if self.failures:
            self.failures -= 1
            return web.json_response({"error": "invalid_grant", "error_description": "refused"}, status=400)
        token = f"ya29.local-{len(self.issued) + 1}"
        self.issued.append(token)
        return web.json_response({"access_token": token, "expires_in": 3600, "token_type": "Bearer"})


@pytest.fixture
async def token_server(aiohttp_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TokenServer:
    """A token server, and a service-account file pointing at it named by GOOGLE_APPLICATION_CREDENTIALS."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    server = TokenServer(key.public_key())
    running = await aiohttp_server(server.app())
    server.url = str(running.make_url("/token"))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    account = {
        "type": "service_account",
        "project_id": "project",
        "private_key_id": "k1",
        "private_key": pem.decode(),
        "client_email": EMAIL,
        "client_id": "1",
        "token_uri": server.url,
    }
    (tmp_path / "sa.json").write_text(json.dumps(account))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "sa.json"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    return server


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[timedelta]:
    """How far the guard's clock runs ahead of the real one (google-auth stamps expiries with the real one)."""
    ahead = [timedelta(0)]
    real = adc.utc_now
    monkeypatch.setattr(adc, "utc_now", lambda: real() + ahead[0])
    return ahead


async def post(proxy: Any, body: dict[str, Any]) -> int:
    async with aiohttp.ClientSession() as session, session.post(proxy.make_url("/v1/chat/completions"), json=body) as r:
        await r.read()
        return r.status


async def vertex_with_adc(start_proxy: Any, upstream: Any) -> Any:
    vertex = {"base_url": upstream.url, "kind": "vertex", "auth": "adc", "read_timeout": 5}
    return await start_proxy(gateway_settings(upstream.url, upstreams={"vertex": vertex}))


class TestServiceAccountThroughTheGuard:
    async def test_the_token_injected_upstream_comes_from_the_service_account_and_is_renewed_after_expiry(
        self, start_proxy, upstream, token_server, clock
    ):
        proxy = await vertex_with_adc(start_proxy, upstream)
        assert await post(proxy, CHAT) == 200
        assert await post(proxy, CHAT) == 200
        assert [r.headers["Authorization"] for r in upstream.received] == ["Bearer ya29.local-1"] * 2
        clock[0] = timedelta(minutes=56)  # within five minutes of the hour's expiry: renewed first
        assert await post(proxy, CHAT) == 200
        assert upstream.received[-1].headers["Authorization"] == "Bearer ya29.local-2"
        assert token_server.issued == ["ya29.local-1", "ya29.local-2"]

    async def test_concurrent_requests_after_expiry_wait_on_one_refresh(self, start_proxy, upstream, token_server, clock):
        proxy = await vertex_with_adc(start_proxy, upstream)
        assert await post(proxy, CHAT) == 200
        clock[0] = timedelta(hours=2)
        token_server.asked.clear()
        token_server.hold.clear()
        requests = [asyncio.create_task(post(proxy, CHAT)) for _ in range(8)]
        await token_server.asked.wait()  # the refresh is in flight and held
        clock[0] = timedelta(0)  # a request that arrives after it finds the new token fresh
        token_server.hold.set()
        assert await asyncio.gather(*requests) == [200] * 8
        assert token_server.issued == ["ya29.local-1", "ya29.local-2"]
        assert {r.headers["Authorization"] for r in upstream.received[1:]} == {"Bearer ya29.local-2"}

    async def test_callers_that_need_a_token_together_share_one_refresh(self, token_server, clock):
        """All eight callers are waiting before the token server answers (they start in one turn of the loop)."""
        auth = UpstreamAuth(UpstreamSettings(name="vertex", base_url="https://x/v1", kind="vertex", auth="adc"))
        assert await auth.header(None, False) == "Bearer ya29.local-1"
        clock[0] = timedelta(hours=2)
        token_server.asked.clear()
        token_server.hold.clear()
        waiting = asyncio.gather(*(auth.header(None, False) for _ in range(8)))
        await token_server.asked.wait()
        token_server.hold.set()
        assert await waiting == ["Bearer ya29.local-2"] * 8
        assert token_server.issued == ["ya29.local-1", "ya29.local-2"]

    async def test_the_client_authorization_never_replaces_it(self, start_proxy, upstream, token_server):
        proxy = await vertex_with_adc(start_proxy, upstream)
        async with aiohttp.ClientSession() as session:
            headers = {"Authorization": "Bearer client-own"}
            async with session.post(proxy.make_url("/v1/chat/completions"), json=CHAT, headers=headers) as r:
                assert r.status == 200
        assert upstream.received[-1].headers["Authorization"] == "Bearer ya29.local-1"


    async def test_with_no_project_in_the_base_url_the_token_goes_only_into_the_credentials_own_project(
        self, start_proxy, upstream, token_server
    ):
        """The service account's file says `project_id: project`; a path naming another is refused in Google's shape."""
        proxy = await vertex_with_adc(start_proxy, upstream)
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        model = "publishers/google/models/gemini-2.5-flash:generateContent"
        async with aiohttp.ClientSession() as session:
            own = f"/v1/projects/project/locations/us-central1/{model}"
            async with session.post(proxy.make_url(own), json=body) as response:
                await response.read()
            other = f"/v1/projects/other/locations/us-central1/{model}"
            async with session.post(proxy.make_url(other), json=body) as response:
                refused = response.status, await response.json()
        assert [r.path for r in upstream.received] == [own]
        assert upstream.received[0].headers["Authorization"] == "Bearer ya29.local-1"
        assert refused[0] == 403 and refused[1]["error"]["status"] == "PERMISSION_DENIED"


class TestGcloudUserCredentials:
    async def test_without_a_credentials_file_gclouds_application_default_login_is_used(
        self, token_server, tmp_path, monkeypatch
    ):
        """`gcloud auth application-default login` writes an authorized-user file in gcloud's folder;
        google-auth sends its refresh to Google's token endpoint whatever the file says, so that
        address is pointed at the local one."""
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS")
        monkeypatch.setattr("google.oauth2.credentials._GOOGLE_OAUTH2_TOKEN_ENDPOINT", token_server.url)
        gcloud = tmp_path / "gcloud"
        gcloud.mkdir()
        user = {
            "type": "authorized_user",
            "client_id": "cid",
            "client_secret": "csecret",
            "refresh_token": "1//refresh",
        }
        (gcloud / "application_default_credentials.json").write_text(json.dumps(user))
        monkeypatch.setenv("CLOUDSDK_CONFIG", str(gcloud))
        auth = UpstreamAuth(UpstreamSettings(name="vertex", base_url="https://x/v1", kind="vertex", auth="adc"))
        assert await auth.header(None, False) == "Bearer ya29.local-1"


class TestMetadataServer:
    async def test_on_gke_or_cloud_run_the_token_comes_from_the_metadata_server(
        self, aiohttp_server, tmp_path, monkeypatch
    ):
        """No credentials file and no gcloud: google-auth finds the metadata server (GCE_METADATA_HOST)."""
        asked: list[str] = []

        async def metadata(request: web.Request) -> web.Response:
            assert request.headers.get("Metadata-Flavor") == "Google"
            asked.append(request.path)
            headers = {"Metadata-Flavor": "Google"}
            if request.path.endswith("/token"):
                return web.json_response({"access_token": "ya29.metadata", "expires_in": 3599, "token_type": "Bearer"}, headers=headers)
            if request.path.endswith("/default/"):
                info = {"email": EMAIL, "scopes": [adc.CLOUD_PLATFORM], "aliases": ["default"]}
                return web.json_response(info, headers=headers)
            return web.Response(text="project", headers=headers)

        app = web.Application()
        app.router.add_get("/{tail:.*}", metadata)
        server = await aiohttp_server(app)
        host = f"127.0.0.1:{server.port}"
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
        monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))  # no gcloud credentials
        monkeypatch.setenv("GCE_METADATA_HOST", host)
        monkeypatch.setenv("GCE_METADATA_IP", host)
        monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
        auth = UpstreamAuth(UpstreamSettings(name="vertex", base_url="https://x/v1", kind="vertex", auth="adc"))
        assert await auth.header("Bearer client-own", False) == "Bearer ya29.metadata"
        assert any(path.endswith("/token") for path in asked)


class TestFailures:
    async def test_no_credentials_anywhere_is_a_generic_502_and_the_reason_goes_to_the_log(
        self, tmp_path, monkeypatch, logs
    ):
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
        auth = UpstreamAuth(UpstreamSettings(name="vertex", base_url="https://x/v1", kind="vertex", auth="adc"))
        with pytest.raises(UpstreamUnavailable, match="operator's log"):
            await auth.header(None, False)
        [event] = logs.events("token_refresh_failed")
        assert "missing.json" in event["reason"] and event["upstream"] == "vertex"

    async def test_a_refresh_that_fails_is_tried_again_by_the_next_request(self, token_server, logs):
        token_server.failures = 1
        auth = UpstreamAuth(UpstreamSettings(name="vertex", base_url="https://x/v1", kind="vertex", auth="adc"))
        with pytest.raises(UpstreamUnavailable):
            await auth.header(None, False)
        assert await auth.header(None, False) == "Bearer ya29.local-1"
        [event] = logs.events("token_refresh_failed")
        assert "RefreshError" in event["reason"] and "ya29" not in logs.text

    def test_listening_beyond_loopback_without_client_keys_is_refused_as_for_any_injected_credential(self):
        vertex = {"base_url": "https://x/v1", "kind": "vertex", "auth": "adc"}
        settings = gateway_settings("https://x/v1", upstreams={"vertex": vertex}, server={"host": "0.0.0.0"})
        problem = settings.exposure_problem({})
        assert problem is not None and "vertex" in problem

    def test_adc_with_another_credential_is_a_config_error(self):
        with pytest.raises(SchemaError, match="auth: adc"):
            UpstreamSettings(name="vertex", base_url="https://x/v1", auth="adc", token_command="gcloud auth print-access-token")

    def test_google_auth_is_imported_only_when_an_upstream_uses_adc(self):
        import subprocess
        import sys

        code = (
            "import sys; from proxy.server.edge.credentials import UpstreamAuth; from proxy.config.upstreams import UpstreamSettings; "
            "UpstreamAuth(UpstreamSettings(name='v', base_url='https://x/v1', token_file='t')); "
            "print('google.auth' in sys.modules)"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "False"
