"""AWS Bedrock's bedrock-runtime: Converse and InvokeModel (`proxy.apis.bedrock`), signed again
with the guard's AWS credentials (`auth: sigv4`, `proxy.providers.bedrock_sigv4`) or sent a
Bedrock API key (`api_key_env`, as `Authorization: Bearer`), its CountTokens asked at the
budget's edge, and nothing passed through uncounted.

The count endpoint: `POST /model/{modelId}/count-tokens` with `{"input": {"converse": {...}}}` (a
Converse request's fields) or `{"input": {"invokeModel": {"body": base64(<the body>)}}}`, answered
`{"inputTokens": N}`, "the token count that would be charged"; it counts for foundation models,
so an inference profile's id is asked under the model it names. Claude's overflow as Bedrock
relays it is Anthropic's sentence after "The model returned the following errors: "
(`proxy.core.learning.corrections`).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import quote

from proxy.core.counting.edge import CountCall
from proxy.core.models.model_registry import BEDROCK_PROFILE, TokenizerSpec
from proxy.providers.anthropic import CLAUDE_BOUND
from proxy.providers.bedrock_sigv4 import AwsKeys, signed_headers, without_client_signing
from proxy.providers.provider import OutgoingCall, Provider, SettingsRefused, SigningKeys

_HOST = re.compile(r"^https?://bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?::\d+)?/?$")
_REGION = re.compile(r"[a-z]{2}(?:-[a-z]+)+-\d")
# What CountTokens reads of a Converse request.
_CONVERSE_FIELDS = ("messages", "system", "toolConfig", "additionalModelRequestFields")


class Bedrock(Provider):
    kind: ClassVar[str] = "bedrock"
    shapes: ClassVar[tuple[str, ...]] = ("converse", "invoke")  # bedrock-runtime's `/model/{modelId}/...`
    backend_kind: ClassVar[str] = "openai"  # must prompt + max_tokens fit, usage in streams: as OpenAI
    count_endpoint: ClassVar[bool] = True
    signs: ClassVar[bool] = True  # the client's AWS headers always dropped; signed with `auth: sigv4`
    # Signed with the guard's credentials, a forwarded path would run uncounted (StartAsyncInvoke).
    forwards_uncounted: ClassVar[bool] = False
    # Claude (a bound over cl100k) and the other makers' models an open bound counts over cl100k.
    vocabularies_at_start: ClassVar[tuple[TokenizerSpec, ...]] = (
        CLAUDE_BOUND,
        TokenizerSpec("tiktoken", "cl100k_base"),
    )

    def check(self, upstream: Any) -> None:
        """A region to sign for (named, or read from `bedrock-runtime.{region}.amazonaws.com`), and
        one credential: `auth: sigv4` or a Bedrock API key (`api_key_env`), never both, never neither."""
        if upstream.region is None:
            found = _HOST.match(upstream.base_url)
            object.__setattr__(upstream, "region", found[1] if found else None)
        if upstream.auth == "sigv4" and upstream.region is None:
            raise SettingsRefused("auth: sigv4 needs the AWS region to sign for (region: us-east-1)", "region")
        if upstream.region is not None and not _REGION.fullmatch(upstream.region):
            raise SettingsRefused(f"region {upstream.region!r} is not an AWS region name (us-east-1)", "region")
        if (upstream.auth == "sigv4") == bool(upstream.api_key_env) or upstream.token_command or upstream.token_file:
            message = "a bedrock upstream signs (auth: sigv4) or sends a Bedrock API key (api_key_env), one of them"
            raise SettingsRefused(message, "auth")

    def signing_keys(self, upstream: Any) -> SigningKeys | None:
        return AwsKeys(upstream.region or "") if upstream.auth == "sigv4" else None

    def finish(self, call: OutgoingCall, keys: object) -> OutgoingCall:
        headers = without_client_signing(call.headers)
        if isinstance(keys, tuple):  # `AwsKeys.current`'s: the frozen credentials and the region (`auth: sigv4`)
            headers = signed_headers(call.method, call.url, headers, call.body, keys)
        return OutgoingCall(call.method, call.url, headers, call.body)

    def count_call(self, base_url: str, model: str, api: str, body: Mapping[str, Any]) -> CountCall | None:
        """CountTokens for the foundation model a profile's id names: a Converse request's fields,
        or an InvokeModel body whole (a blob: base64 of its JSON)."""
        if api not in self.shapes:
            return None
        # `:` unescaped: the HTTP client sends it so, and the signature must cover the path as sent.
        foundation = quote(BEDROCK_PROFILE.sub("", model), safe=":")
        if api == "converse":
            counted: dict[str, Any] = {"converse": {k: body[k] for k in _CONVERSE_FIELDS if k in body}}
        else:
            data = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
            counted = {"invokeModel": {"body": base64.b64encode(data).decode("ascii")}}
        url = f"{base_url.rstrip('/')}/model/{foundation}/count-tokens"
        return CountCall(url, {"input": counted}, "inputTokens")
