"""A fake AWS Bedrock (bedrock-runtime) for the tests: it checks each request as AWS would, and
answers in Bedrock's shapes.

- Authentication: a SigV4 signature is computed again with botocore from the credentials the
  fake was given (the guard's), the request's own date, URL and body; a missing or wrong one is
  refused 403 `InvalidSignatureException`, as AWS refuses it. With `api_key`, a Bedrock API key
  (`Authorization: Bearer`) is checked instead.
- The window: the prompt's texts (system, messages, tool inputs and results) counted with
  cl100k_base, a count that shares no code with the guard's (Claude's bound in the guard is an upper
  bound over it); over `window`, Bedrock's ValidationException with Anthropic's overflow sentence.
- Bedrock Mantle's `/anthropic/v1/messages` (`x-api-key`), answered as Anthropic Messages.
- Answers: Converse (whole, and its event stream: messageStart ... metadata with `usage`), InvokeModel
  (an Anthropic Messages answer) and its stream (`chunk` events of base64 Anthropic events); the
  invoke answers follow `script` (a tool call, then a final answer) when one is given, for the
  requests of an agent's loop (those offering the tool, then those answering it).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import re
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import boto3
from aiohttp import web
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.config import Config
from botocore.credentials import Credentials
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from proxy.apis.bedrock.aws_event_stream import encode_message
from proxy.config.settings import settings_from_dict
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.support.cookbook import encoding

REGION = "us-east-1"
GUARD_KEY, GUARD_SECRET, GUARD_TOKEN = "AKIDGUARDEXAMPLE", "guard/secret/key/EXAMPLE", "guard-session-token"
# The guard's AWS credentials as its environment gives them (botocore's chain reads these first),
# with every other source of the chain closed: no profile file, no instance metadata.
GUARD_AWS_ENV = {"AWS_ACCESS_KEY_ID": GUARD_KEY, "AWS_SECRET_ACCESS_KEY": GUARD_SECRET, "AWS_SESSION_TOKEN": GUARD_TOKEN,
                 "AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
                 "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip
_PATH = re.compile(r"/model/(?P<model>[^/]+)/(?P<operation>[a-z-]+)")
_AUTHORIZATION = re.compile(
    r"AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<scope>[^,]+), SignedHeaders=(?P<signed>[^,]+), "
    r"Signature=(?P<signature>[0-9a-f]{64})"
)
CL100K = encoding("gpt-4")  # cl100k_base, from local files


@dataclass
class Received:
    operation: str
    model: str  # decoded from the path
    raw_path: str
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class ToolCall:
    name: str
    input: dict[str, Any]


@dataclass
class FakeBedrock:
    window: int = 16_000
    api_key: str | None = None  # checked as `Authorization: Bearer` instead of a signature
    script: list[ToolCall | str] = field(default_factory=list)  # the invoke answers, in turn
    received: list[Received] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)  # why each refused request was refused
    break_after: int | None = None  # a stream cut off, mid-frame, after this many frames
    arrived: list[str] = field(default_factory=list)  # the path of every request that came, answered or not
    loop_bodies: list[Mapping[str, Any]] = field(default_factory=list)  # the bodies the script answered

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/anthropic/v1/messages", self._mantle)
        app.router.add_route("POST", "/{tail:.*}", self._handle)
        return app

    def last(self, operation: str) -> Received:
        return next(r for r in reversed(self.received) if r.operation == operation)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.arrived.append(request.raw_path)
        found = _PATH.fullmatch(request.raw_path.split("?", 1)[0])
        if found is None:
            return _error(404, "UnknownOperationException", "no such path")
        body = await request.read()
        why = self._unauthenticated(request, body)
        if why is not None:
            self.refused.append(why)
            return _error(403, "InvalidSignatureException", why)
        operation, model = found["operation"], unquote(found["model"])
        self.received.append(Received(operation, model, request.raw_path, dict(request.headers), body))
        payload = json.loads(body)
        if operation == "count-tokens":
            return web.json_response({"inputTokens": prompt_tokens(_counted_body(payload))})
        tokens = prompt_tokens(payload)
        if tokens > self.window:
            message = (
                f"The model returned the following errors: prompt is too long: {tokens} tokens > {self.window} maximum"
            )
            return _error(400, "ValidationException", message)
        if operation == "converse":
            return web.json_response(_converse_answer(tokens))
        if operation == "converse-stream":
            return await _stream(request, _converse_events(tokens), self.break_after)
        answer = self._next_answer(payload)
        if operation == "invoke":
            return web.json_response(_messages_answer(answer, tokens))
        return await _stream(request, _invoke_events(answer, tokens), self.break_after)

    async def _mantle(self, request: web.Request) -> web.Response:
        """Bedrock Mantle's Anthropic Messages endpoint: a Bedrock API key as `x-api-key`."""
        body = await request.read()
        if request.headers.get("x-api-key") != self.api_key:
            self.refused.append("the API key is not the one expected")
            return web.json_response(
                {"type": "error", "error": {"type": "authentication_error", "message": "no"}}, status=401
            )
        self.received.append(Received("mantle", "", request.raw_path, dict(request.headers), body))
        tokens = prompt_tokens(json.loads(body))
        if tokens > self.window:
            error = {
                "type": "invalid_request_error",
                "message": f"prompt is too long: {tokens} tokens > {self.window} maximum",
            }
            return web.json_response({"type": "error", "error": error}, status=400)
        return web.json_response(_messages_answer("Done.", tokens))

    def _unauthenticated(self, request: web.Request, body: bytes) -> str | None:
        given = request.headers.get("Authorization", "")
        if self.api_key is not None:
            return None if given == f"Bearer {self.api_key}" else "the API key is not the one expected"
        return signature_problem(request, body)

    def _next_answer(self, body: Mapping[str, Any]) -> ToolCall | str:
        """The script's next answer, for the agent loop's requests: those that offer the tool the
        script calls next (Claude Code's title or quota requests offer none: "Done.")."""
        if not self.script:
            return "Done."
        offered = {t.get("name") for t in body.get("tools") or () if isinstance(t, Mapping)}
        following = self.script[0]
        if isinstance(following, ToolCall) and following.name not in offered:
            return "Done."
        if isinstance(following, str) and not _answers_a_tool(body):
            return "Done."
        self.loop_bodies.append(body)
        return self.script.pop(0)


def signature_problem(request: web.Request, body: bytes) -> str | None:
    """Why the request's SigV4 signature is not the guard's, or None when it is."""
    found = _AUTHORIZATION.fullmatch(request.headers.get("Authorization", ""))
    if found is None:
        return "no SigV4 Authorization header"
    if found["key"] != GUARD_KEY or not found["scope"].endswith(f"/{REGION}/bedrock/aws4_request"):
        return f"signed with another key or scope ({found['key']}, {found['scope']})"
    if request.headers.get("X-Amz-Security-Token") != GUARD_TOKEN:
        return "the session token is not the guard's"
    names = found["signed"].split(";")
    headers = {name: request.headers.get(name, "") for name in names}
    signed = AWSRequest(
        method=request.method, url=f"http://{request.host}{request.raw_path}", data=body, headers=headers
    )
    signed.context["timestamp"] = request.headers.get("X-Amz-Date", "")
    auth = SigV4Auth(Credentials(GUARD_KEY, GUARD_SECRET, GUARD_TOKEN), "bedrock", REGION)
    expected = auth.signature(auth.string_to_sign(signed, auth.canonical_request(signed)), signed)
    return None if expected == found["signature"] else "The request signature we calculated does not match"


def prompt_tokens(body: Mapping[str, Any]) -> int:
    """cl100k_base tokens of every text a Converse or Messages body puts in the prompt."""
    return sum(len(CL100K.encode(text)) for text in _texts(body))


def _texts(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for key, inner in value.items():
            if key in ("toolUseId", "tool_use_id", "id", "role", "type", "anthropic_version", "inferenceConfig",
                       "max_tokens", "format"):  # fmt: skip
                continue
            yield from _texts(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _texts(inner)


def _answers_a_tool(body: Mapping[str, Any]) -> bool:
    messages = body.get("messages") or []
    content = messages[-1].get("content") if messages else None
    return isinstance(content, list) and any(isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content)


def _counted_body(payload: Mapping[str, Any]) -> Mapping[str, Any]:
    given = payload["input"]
    return given["converse"] if "converse" in given else json.loads(given["invokeModel"]["body"])


def _error(status: int, name: str, message: str) -> web.Response:
    return web.json_response(
        {"message": message}, status=status, headers={"x-amzn-ErrorType": f"{name}:http://internal.amazon.com/"}
    )


def _converse_answer(tokens: int) -> dict[str, Any]:
    return {
        "output": {"message": {"role": "assistant", "content": [{"text": "Done."}]}},
        "stopReason": "end_turn",
        "usage": {"inputTokens": tokens, "outputTokens": 2, "totalTokens": tokens + 2},
        "metrics": {"latencyMs": 1},
    }


def _converse_events(tokens: int) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("messageStart", {"role": "assistant"}),
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Done"}}),
        ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "."}}),
        ("contentBlockStop", {"contentBlockIndex": 0}),
        ("messageStop", {"stopReason": "end_turn"}),
        ("metadata", {"usage": {"inputTokens": tokens, "outputTokens": 2, "totalTokens": tokens + 2},
                      "metrics": {"latencyMs": 1}}),
    ]  # fmt: skip


def _messages_answer(answer: ToolCall | str, tokens: int) -> dict[str, Any]:
    content: list[dict[str, Any]]
    if isinstance(answer, ToolCall):
        content = [{"type": "tool_use", "id": "toolu_01", "name": answer.name, "input": answer.input}]
    else:
        content = [{"type": "text", "text": answer}]
    return {
        "id": "msg_bedrock",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": content,
        "stop_reason": "tool_use" if isinstance(answer, ToolCall) else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": tokens, "output_tokens": 5},
    }


def _invoke_events(answer: ToolCall | str, tokens: int) -> list[tuple[str, dict[str, Any]]]:
    whole = _messages_answer(answer, tokens)
    start = {**whole, "content": [], "stop_reason": None, "usage": {"input_tokens": tokens, "output_tokens": 1}}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    if isinstance(answer, ToolCall):
        block = {"type": "tool_use", "id": "toolu_01", "name": answer.name, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(answer.input)}
    else:
        block, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": answer}
    events += [
        {"type": "content_block_start", "index": 0, "content_block": block},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": None},
         "usage": {"output_tokens": 5}},
        {"type": "message_stop", "amazon-bedrock-invocationMetrics": {"inputTokenCount": tokens}},
    ]  # fmt: skip
    return [("chunk", {"bytes": base64.b64encode(json.dumps(e).encode()).decode(), "p": "abc"}) for e in events]


async def _stream(
    request: web.Request, events: list[tuple[str, dict[str, Any]]], break_after: int | None
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/vnd.amazon.eventstream"})
    await response.prepare(request)
    for k, (name, payload) in enumerate(events):
        headers = {":event-type": name, ":content-type": "application/json", ":message-type": "event"}
        frame = encode_message(headers, json.dumps(payload).encode())
        if k == break_after:  # half a frame, then the connection goes
            await response.write(frame[: len(frame) // 2])
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write(frame)
    await response.write_eof()
    return response


def self_signed(folder: Path) -> tuple[ssl.SSLContext, str]:
    """A throwaway certificate for 127.0.0.1: the server's TLS context and the CA file a client trusts."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    cert_file, key_file = folder / "guard.pem", folder / "guard.key"
    cert_file.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_file, key_file)
    return context, str(cert_file)


async def guard_before(
    aiohttp_server: Any,
    model_map: Any,
    fake: FakeBedrock,
    upstream: Mapping[str, Any] | None = None,
    sections: Mapping[str, Any] | None = None,
    **listen: Any,
) -> str:
    """The guard's root URL, served by pytest-aiohttp's `aiohttp_server` (with `listen`, e.g. its
    `ssl`) in front of `fake` as a bedrock upstream signing with SigV4 (an `upstream` entry set to
    None drops that key: `auth` for an API key) with every model routed to it, and the settings'
    other `sections`; `BEDROCK_KEY` is the guard's own API key."""
    fake_url = str((await aiohttp_server(fake.app())).make_url("")).rstrip("/")
    entry = {"kind": "bedrock", "base_url": fake_url, "region": REGION, "auth": "sigv4", "read_timeout": 10,
             "connect_timeout": 2} | dict(upstream or {})  # fmt: skip
    data = {
        "upstreams": {"bedrock": {k: v for k, v in entry.items() if v is not None}},
        "routes": [{"match": "*", "upstream": "bedrock"}],
        **(sections or {}),
    }
    settings = settings_from_dict(data, "test.yaml", {"BEDROCK_KEY": "guard-bedrock-key"})
    server = await aiohttp_server(create_app(settings, Models(settings, model_map)), **listen)
    return str(server.make_url("")).rstrip("/")


def boto3_client(url: str, **given: Any) -> Any:
    """boto3's bedrock-runtime client for the guard at `url`, with its own dummy credentials unless
    `given` says otherwise, never retrying."""
    credentials = {"aws_access_key_id": "AKIDCLIENTDUMMY", "aws_secret_access_key": "client-dummy-secret"}
    return boto3.client("bedrock-runtime", region_name=REGION, endpoint_url=url,
                        config=Config(retries={"max_attempts": 1}), **(credentials | given))  # fmt: skip
