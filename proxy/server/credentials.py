"""The `Authorization` header each upstream gets.

In order of preference:
1. a short-lived token from a command (`gcloud auth print-access-token` for Vertex AI) or a file,
   fetched on first use and again every `token_refresh_seconds` (before Google's one-hour expiry);
2. an API key from the environment variable named by `api_key_env`, so clients never hold it;
3. the client's own `Authorization`, passed through, unless the proxy checks client keys of its
   own (then the client's header is the proxy's key and is never forwarded).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from proxy.errors import UpstreamUnavailable
from proxy.settings import UpstreamSettings

COMMAND_TIMEOUT_SECONDS = 30.0


class UpstreamAuth:
    def __init__(
        self,
        upstream: UpstreamSettings,
        env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.upstream = upstream
        self._env = os.environ if env is None else env
        self._clock = clock
        self._token: str | None = None
        self._fetched_at = 0.0
        self._lock = asyncio.Lock()

    @property
    def uses_token(self) -> bool:
        return bool(self.upstream.token_command or self.upstream.token_file)

    async def header(self, client_authorization: str | None, client_keys_in_use: bool) -> str | None:
        if self.uses_token:
            return f"Bearer {await self.token()}"
        name = self.upstream.api_key_env
        if name and self._env.get(name):
            return f"Bearer {self._env[name]}"
        return None if client_keys_in_use else client_authorization

    async def token(self) -> str:
        if self._token is not None and self._clock() - self._fetched_at < self.upstream.token_refresh_seconds:
            return self._token
        async with self._lock:
            if self._token is None or self._clock() - self._fetched_at >= self.upstream.token_refresh_seconds:
                self._token = await self._fetch()
                self._fetched_at = self._clock()
            return self._token

    async def _fetch(self) -> str:
        source = self.upstream.token_command or self.upstream.token_file or ""
        try:
            if self.upstream.token_command:
                token = await self._run(self.upstream.token_command)
            else:
                token = await asyncio.to_thread(Path(source).read_text, encoding="utf-8")
        except (OSError, TimeoutError, RuntimeError) as exc:
            raise UpstreamUnavailable(
                f"could not obtain an access token for upstream {self.upstream.name!r}: {exc}"
            ) from None
        token = token.strip()
        if not token:
            raise UpstreamUnavailable(f"the access token for upstream {self.upstream.name!r} is empty")
        return token

    @staticmethod
    async def _run(command: str) -> str:
        process = await asyncio.create_subprocess_exec(
            *shlex.split(command), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        try:
            out, err = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT_SECONDS)
        except TimeoutError:
            process.kill()
            raise TimeoutError(f"token command timed out after {COMMAND_TIMEOUT_SECONDS:g} s") from None
        if process.returncode != 0:
            # The command's own message, not its output: output may be a partial secret.
            raise RuntimeError(
                f"token command exited with {process.returncode}: {err.decode(errors='replace').strip()[:200]}"
            )
        return out.decode()
