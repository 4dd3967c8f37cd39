"""Google's Application Default Credentials for an upstream configured with `auth: adc`.

`google-auth` finds the credentials the way every Google client does (`google.auth.default`): the
service-account or workload-identity file named by `GOOGLE_APPLICATION_CREDENTIALS`, gcloud's
user credentials (`gcloud auth application-default login`), or the metadata server on GKE, Cloud
Run and Compute Engine. The guard only asks it for an access token for the `cloud-platform` scope.

google-auth is synchronous: the first lookup and every refresh run in a thread, never on the event
loop. One refresh is in flight at a time (every request that needs a token meanwhile awaits that
one), and a token is reused until `REFRESH_MARGIN` before it expires (Google's tokens live an
hour), so requests do not wait on a refresh except the first and the one after each expiry.
google-auth is imported only when an upstream uses ADC.

A lookup or refresh that fails raises `AdcError` with google-auth's reason (which may name an
account or a file, never a token): the caller logs it and answers the client a generic 502.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

CLOUD_PLATFORM = "https://www.googleapis.com/auth/cloud-platform"
REFRESH_MARGIN = timedelta(minutes=5)
REFRESH_TIMEOUT_SECONDS = 30.0  # as long as a caller waits for a token (a token command gets as long)


class AdcError(Exception):
    """Why no token could be had from ADC: for the operator's log, never for a client."""


def utc_now() -> datetime:
    """Now, as google-auth writes expiries: naive UTC."""
    return datetime.now(UTC).replace(tzinfo=None)


class AdcTokens:
    """Access tokens from Application Default Credentials, refreshed in a thread, one refresh at a time."""

    def __init__(self, scopes: tuple[str, ...] = (CLOUD_PLATFORM,), now: Callable[[], datetime] | None = None) -> None:
        self._scopes = scopes
        self._now = now  # None: `utc_now`, looked up when called (a test moves it)
        self._credentials: Any = None  # google.auth.credentials.Credentials, once found
        self.project: str | None = None  # the project the credentials belong to, once found (None: not said)
        self._refreshing: asyncio.Task[str] | None = None

    async def token(self) -> str:
        """A token valid for at least `REFRESH_MARGIN`, refreshed first when it is not."""
        credentials = self._credentials
        if credentials is not None and self._fresh(credentials):
            return str(credentials.token)
        task = self._refreshing
        if task is None:
            task = self._refreshing = asyncio.create_task(self._refresh())
            task.add_done_callback(self._refreshed)
        try:
            # Shielded: a client that goes away, or waits too long, leaves the refresh to the others.
            return await asyncio.wait_for(asyncio.shield(task), REFRESH_TIMEOUT_SECONDS)
        except TimeoutError:
            raise AdcError(f"no token within {REFRESH_TIMEOUT_SECONDS:g} s (the refresh goes on)") from None

    def _refreshed(self, task: asyncio.Task[str]) -> None:
        if self._refreshing is task:
            self._refreshing = None  # the next caller that finds the token stale starts another
        if not task.cancelled():
            task.exception()  # each caller that awaited it has it; none left is not an error to report

    def _fresh(self, credentials: Any) -> bool:
        expiry = credentials.expiry  # None: a token that states no expiry (google-auth's own rule: valid)
        now = (self._now or utc_now)()
        return bool(credentials.token) and (expiry is None or expiry - now > REFRESH_MARGIN)

    async def _refresh(self) -> str:
        return await asyncio.to_thread(self._refresh_in_thread)

    def _refresh_in_thread(self) -> str:
        try:
            import google.auth
            import google.auth.exceptions
            import google.auth.transport.requests
        except ImportError as exc:
            raise AdcError(f"auth: adc needs the google-auth package with requests: {exc}") from None
        try:
            if self._credentials is None:
                credentials, project = google.auth.default(scopes=list(self._scopes))
                self._credentials, self.project = credentials, project or None
            self._credentials.refresh(google.auth.transport.requests.Request())
        except google.auth.exceptions.GoogleAuthError as exc:
            raise AdcError(f"Application Default Credentials: {type(exc).__name__}: {exc}"[:500]) from None
        if not self._credentials.token:
            raise AdcError("Application Default Credentials gave no token")
        return str(self._credentials.token)
