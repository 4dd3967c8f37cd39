"""The guard's SigV4 signing as the server drives it: botocore's credentials found and refreshed off
the event loop, never logged; a large body signed in a thread; one client known by its access key,
not its signature."""

from __future__ import annotations

import datetime
import threading
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.credentials import RefreshableCredentials

from proxy.config.upstreams import UpstreamSettings
from proxy.errors import UpstreamUnavailable
from proxy.providers import bedrock_sigv4
from proxy.providers.provider import OutgoingCall
from proxy.server.edge.credentials import SIGN_ON_LOOP_BYTES, UpstreamAuth, credential_digest

BASE = "https://bedrock-runtime.us-east-1.amazonaws.com"
URL = f"{BASE}/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse"


class Log:
    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def error(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


def _refreshable(expiry: datetime.timedelta, fetched: list[str]) -> RefreshableCredentials:
    def refresh() -> dict[str, str]:
        fetched.append(threading.current_thread().name)
        expires = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        return {"access_key": f"AKIDNEW{len(fetched)}", "secret_key": "fresh-secret", "token": "fresh-token",
                "expiry_time": expires.isoformat()}  # fmt: skip

    expires = (datetime.datetime.now(datetime.UTC) + expiry).isoformat()
    return RefreshableCredentials.create_from_metadata(
        {"access_key": "AKIDOLD", "secret_key": "old-secret", "token": "old-token", "expiry_time": expires},
        refresh, "test",
    )  # fmt: skip


def _auth(log: Log | None = None) -> UpstreamAuth:
    upstream = UpstreamSettings(name="bedrock", kind="bedrock", base_url=BASE, auth="sigv4")
    return UpstreamAuth(upstream, env={}, log=log or Log())


def _call(body: bytes = b"{}") -> OutgoingCall:
    return OutgoingCall("POST", URL, {"Content-Type": "application/json"}, body)


class TestSigningCredentials:
    async def test_credentials_due_for_refresh_are_refreshed_in_a_thread_then_sign(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        fetched: list[str] = []
        found = _refreshable(datetime.timedelta(minutes=1), fetched)
        monkeypatch.setattr(bedrock_sigv4, "_find_credentials", lambda: found)
        headers = (await _auth().finished(_call())).headers
        assert fetched and fetched[0] != threading.current_thread().name  # not on the loop's thread
        assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDNEW1/")
        assert "content-type;host;x-amz-date;x-amz-security-token" in headers["Authorization"]
        assert headers["X-Amz-Security-Token"] == "fresh-token"

    async def test_credentials_that_are_not_due_are_not_refreshed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fetched: list[str] = []
        found = _refreshable(datetime.timedelta(hours=2), fetched)
        monkeypatch.setattr(bedrock_sigv4, "_find_credentials", lambda: found)
        auth = _auth()
        for _ in range(3):
            headers = (await auth.finished(_call())).headers
        assert fetched == [] and headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDOLD/")

    async def test_no_credentials_is_a_502_and_a_log_line_without_secrets(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def missing() -> Any:
            raise LookupError("profile 'secret-profile' in /home/ops/.aws/config has no keys")

        monkeypatch.setattr(bedrock_sigv4, "_find_credentials", missing)
        log = Log()
        with pytest.raises(UpstreamUnavailable):
            await _auth(log).finished(_call())
        assert log.lines[0] == ("signing_credentials_failed", {"upstream": "bedrock", "reason": "LookupError"})


class TestClientIdentity:
    def test_a_sigv4_client_is_known_by_its_access_key_not_its_signature(self) -> None:
        def signed(signature: str, key: str = "AKIDCLIENT") -> dict[str, str]:
            value = f"AWS4-HMAC-SHA256 Credential={key}/20261202/us-east-1/bedrock/aws4_request, SignedHeaders=host, Signature={signature}"
            return {"Authorization": value}

        assert credential_digest(signed("a" * 64)) == credential_digest(signed("b" * 64))
        assert credential_digest(signed("a" * 64)) != credential_digest(signed("a" * 64, "AKIDOTHER"))


class TestLargeBodies:
    async def test_a_large_body_is_signed_in_a_thread_a_small_one_on_the_loop(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        found = _refreshable(datetime.timedelta(hours=2), [])
        monkeypatch.setattr(bedrock_sigv4, "_find_credentials", lambda: found)
        threads: list[str] = []
        add_auth = SigV4Auth.add_auth

        def recorded(self: Any, request: Any) -> None:
            threads.append(threading.current_thread().name)
            add_auth(self, request)

        monkeypatch.setattr(SigV4Auth, "add_auth", recorded)
        auth = _auth()
        for size in (1024, SIGN_ON_LOOP_BYTES + 1):
            headers = (await auth.finished(_call(b"x" * size))).headers
            assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDOLD/")
        assert threads[0] == threading.current_thread().name != threads[1]
