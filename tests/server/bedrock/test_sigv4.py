"""The guard's SigV4 signer: botocore's credentials, found and refreshed off the event loop, never
logged; the client's own AWS headers dropped; one client known by its access key, not its signature."""

from __future__ import annotations

import datetime
import threading
from typing import Any

import pytest
from botocore.auth import SigV4Auth
from botocore.credentials import RefreshableCredentials
from multidict import CIMultiDict

from proxy.errors import UpstreamUnavailable
from proxy.server.bedrock import sigv4
from proxy.server.bedrock.sigv4 import SigV4Signer, bedrock_headers
from proxy.server.edge.credentials import credential_digest

URL = "https://bedrock-runtime.us-east-1.amazonaws.com/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/converse"


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


class TestSigV4Signer:
    async def test_credentials_due_for_refresh_are_refreshed_in_a_thread_then_sign(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        fetched: list[str] = []
        monkeypatch.setattr(sigv4, "_find_credentials", lambda: _refreshable(datetime.timedelta(minutes=1), fetched))
        signer = SigV4Signer("us-east-1", Log())
        headers: CIMultiDict[str] = CIMultiDict({"Content-Type": "application/json"})
        await signer.sign("POST", URL, headers, b"{}")
        assert fetched and fetched[0] != threading.current_thread().name  # not on the loop's thread
        assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDNEW1/")
        assert "content-type;host;x-amz-date;x-amz-security-token" in headers["Authorization"]
        assert headers["X-Amz-Security-Token"] == "fresh-token"

    async def test_credentials_that_are_not_due_are_not_refreshed(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fetched: list[str] = []
        monkeypatch.setattr(sigv4, "_find_credentials", lambda: _refreshable(datetime.timedelta(hours=2), fetched))
        signer = SigV4Signer("us-east-1", Log())
        for _ in range(3):
            headers: CIMultiDict[str] = CIMultiDict()
            await signer.sign("POST", URL, headers, b"{}")
        assert fetched == [] and headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDOLD/")

    async def test_no_credentials_is_a_502_and_a_log_line_without_secrets(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def missing() -> Any:
            raise LookupError("profile 'secret-profile' in /home/ops/.aws/config has no keys")

        monkeypatch.setattr(sigv4, "_find_credentials", missing)
        log = Log()
        signer = SigV4Signer("us-east-1", log)
        assert not await signer.ready()
        with pytest.raises(UpstreamUnavailable):
            await signer.sign("POST", URL, CIMultiDict(), b"{}")
        assert log.lines[0] == ("aws_credentials_failed", {"region": "us-east-1", "reason": "LookupError"})


class TestClientHeaders:
    def test_the_clients_aws_headers_are_dropped_and_bedrocks_own_kept(self) -> None:
        headers: CIMultiDict[str] = CIMultiDict({
            "X-Amz-Date": "20261202T000000Z", "X-Amz-Security-Token": "client-token",
            "x-amz-content-sha256": "abc", "X-Amzn-Bedrock-Trace": "ENABLED", "Content-Type": "application/json",
        })  # fmt: skip
        bedrock_headers(headers)
        assert dict(headers) == {"X-Amzn-Bedrock-Trace": "ENABLED", "Content-Type": "application/json"}

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
        monkeypatch.setattr(sigv4, "_find_credentials", lambda: _refreshable(datetime.timedelta(hours=2), []))
        threads: list[str] = []
        add_auth = SigV4Auth.add_auth

        def recorded(self: Any, request: Any) -> None:
            threads.append(threading.current_thread().name)
            add_auth(self, request)

        monkeypatch.setattr(SigV4Auth, "add_auth", recorded)
        signer = SigV4Signer("us-east-1", Log())
        for size in (1024, sigv4.SIGN_ON_LOOP_BYTES + 1):
            headers: CIMultiDict[str] = CIMultiDict()
            await signer.sign("POST", URL, headers, b"x" * size)
            assert headers["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDOLD/")
        assert threads[0] == threading.current_thread().name != threads[1]
