"""bedrock-runtime's paths (`POST /model/{modelId}/{operation}`), read once, and the adapters of
the two operations that are not Converse: InvokeModel for Claude (an Anthropic Messages body) and
CountTokens (either body, wrapped).

    /model/{modelId}/converse, /converse-stream                 converse (`proxy.apis.bedrock.converse`)
    /model/{modelId}/invoke, /invoke-with-response-stream       invoke: Claude's Messages body, with
                                                                `anthropic_version: bedrock-2023-05-31`
                                                                and no `model` (the model is the path's)
    /model/{modelId}/count-tokens                               answered by the guard: `{"inputTokens": N}`

A model id holds `:` (`anthropic.claude-sonnet-4-5-20250929-v1:0`) and, as an ARN, a `/`
(`arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.anthropic.claude-...`); SDKs send it
percent-encoded in one path segment. Its canonical spelling keeps that one segment: the id decoded
once, with an ARN's `/` written `%2F` (`bedrock_path`). A request is routed by the model the id
names (an ARN's resource: a foundation model or an inference profile, `routed_model`) and sent
upstream under the id the client wrote, encoded again as one segment (`upstream_path`).

InvokeModel bodies of other models (Llama's prompt with its chat template, Mistral's `[INST]`
prompt, Nova's `messages-v1`) are each their maker's own format, which the guard does not read: it
refuses them (ValidationException, naming Converse, which it counts for every model) rather than
forward a prompt it cannot count.

Two shapes register here (`converse_shape`, `invoke_shape`: a line each in
`proxy.apis.registry.SHAPES`); both read bedrock-runtime's raw paths themselves
(`Shape.reads_path` = `bedrock_path`), since the general path reader refuses an encoded `/`.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from collections.abc import Mapping
from typing import Any, ClassVar
from urllib.parse import quote, unquote

from proxy.apis.anthropic.messages import MessagesAdapter
from proxy.apis.base import Adapter, InvalidRequest, Parsed, require_object
from proxy.apis.bedrock.converse import BedrockWays, ConverseAdapter, foundation_model
from proxy.apis.endpoints import Endpoint, Shape, ShapeOptions
from proxy.apis.fields import NOTHING_KNOWN, KnownPrefix
from proxy.core.models.model_registry import ModelProfile

OPERATIONS = ("converse", "converse-stream", "invoke", "invoke-with-response-stream", "count-tokens")
STREAMING = frozenset({"converse-stream", "invoke-with-response-stream"})
# The canonical spelling: `/model/{id}/{operation}`, the id's `/` (an ARN's) as `%2F`.
BEDROCK_PATH = re.compile(rf"/model/(?P<model>[^/]+)/(?P<operation>{'|'.join(OPERATIONS)})")
_RAW_PATH = re.compile(rf"/model/(?P<model>[^/]+)/(?P<operation>{'|'.join(OPERATIONS)})/?")
# What a model id, an inference profile's id or an ARN is made of (AWS's own patterns, joined).
_MODEL_ID = re.compile(
    r"[A-Za-z0-9._:+-]{1,256}|arn:aws[a-z-]*:bedrock:[a-z0-9-]*:\d{0,12}:[a-z-]+/[A-Za-z0-9._:+-]{1,256}"
)
BEDROCK_ANTHROPIC_VERSION = "bedrock-2023-05-31"


def bedrock_path(raw: str) -> str | None:
    """The canonical spelling of a bedrock-runtime path as it came (still percent-encoded), or None
    for any other path; ValueError for a model id no Bedrock model has (it is never guessed at)."""
    found = _RAW_PATH.fullmatch(raw)
    if found is None:
        return None
    try:
        model = unquote(found["model"], errors="strict")
    except UnicodeDecodeError:
        raise ValueError("the model id in the path does not decode to UTF-8") from None
    if not _MODEL_ID.fullmatch(model) or ".." in model:
        raise ValueError("the model id in the path is not a Bedrock model id, inference profile or ARN")
    return f"/model/{model.replace('/', '%2F')}/{found['operation']}"


def model_id(segment: str) -> str:
    """The model id a canonical path's segment holds (an ARN's `%2F` back to `/`)."""
    return segment.replace("%2F", "/")


def routed_model(model: str) -> str:
    """The name a request is routed and counted by: an ARN's resource (an inference profile's id,
    `us.anthropic.claude-...`, or a foundation model's), else the id as written. An application
    profile's or a provisioned model's ARN names no model: the ARN itself."""
    if not model.startswith("arn:"):
        return model
    inside = foundation_model(model)
    return model if inside == model else model.split("/", 1)[1]


def upstream_path(model: str, operation: str, served: str | None) -> str:
    """The path sent under the upstream's base URL: the model a route renames it to, else the id
    the client wrote (an ARN stays an ARN), as one percent-encoded segment."""
    name = model if served in (None, routed_model(model)) else served
    return f"/model/{quote(name or model, safe='')}/{operation}"


class InvokeAdapter(BedrockWays, MessagesAdapter):
    """InvokeModel(WithResponseStream) of Claude: Anthropic's Messages body as Bedrock takes it,
    counted and cut by the Messages adapter; errors in Bedrock's shape."""

    name: ClassVar[str] = "invoke"

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        checked = require_object(body)
        if "anthropic_version" not in checked:
            raise InvalidRequest(
                "context-guard counts InvokeModel bodies in Anthropic's Messages format (anthropic_version: "
                f"{BEDROCK_ANTHROPIC_VERSION}); other models' native bodies are not read: send them with Converse, "
                "which the guard counts for every model",
                param="anthropic_version",
            )
        return super().parse(checked, known)


class CountTokensAdapter(BedrockWays, Adapter):
    """CountTokens: `{"input": {"converse": {...}}}` read by the Converse adapter, `{"input":
    {"invokeModel": {"body": "<a Messages body as a JSON string>"}}}` by the invoke adapter
    (`max_tokens` optional there, as the provider counts the prompt alone)."""

    name: ClassVar[str] = "bedrock.count_tokens"
    accounted: ClassVar[frozenset[str]] = frozenset({"input"})

    def __init__(self) -> None:
        self._converse, self._invoke = ConverseAdapter(), _CountedInvoke()

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        given = require_object(body).get("input")
        if not isinstance(given, Mapping) or len(given) != 1:
            raise InvalidRequest("input: must hold exactly one of converse or invokeModel", param="input")
        if isinstance(given.get("converse"), Mapping):
            return self._converse.parse(given["converse"])
        invoke = given.get("invokeModel")
        text = invoke.get("body") if isinstance(invoke, Mapping) else None
        if not isinstance(text, str):
            raise InvalidRequest("input.invokeModel.body: must be the request body as a string", param="input")
        return self._invoke.parse(_invoke_body(text))

    def profile(self, profile: ModelProfile, parsed: Parsed) -> ModelProfile:
        adapter = self._invoke if "anthropic_version" in parsed.body else self._converse
        return adapter.profile(profile, parsed)


class _CountedInvoke(InvokeAdapter):
    requires_max_tokens: ClassVar[bool] = False


def _invoke_body(text: str) -> object:
    """CountTokens' `invokeModel.body`: a blob, so base64 on the wire (as the SDKs send it); its
    JSON written as a string is read too."""
    try:
        return json.loads(base64.b64decode(text, validate=True))
    except (binascii.Error, ValueError, RecursionError):  # nested past the interpreter's limit too
        pass
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidRequest(
            "input.invokeModel.body: must be the request body (JSON), base64-encoded", param="input.invokeModel.body"
        ) from None


def count_tokens_answer(total: int) -> Mapping[str, Any]:
    return {"inputTokens": total}


def _endpoint(adapters: Mapping[str, Adapter], path: str) -> Endpoint | None:
    """The endpoint of a canonical bedrock-runtime path whose operation one of `adapters` reads:
    routed and counted by the model the id names, sent under the id as written."""
    found = BEDROCK_PATH.fullmatch(path)
    if found is None or found["operation"] not in adapters:
        return None
    model, operation = model_id(found["model"]), found["operation"]
    adapter, named = adapters[operation], routed_model(model)
    if operation == "count-tokens":
        return Endpoint(adapter, named, local=True, answer=count_tokens_answer)
    sent = functools.partial(upstream_path, model, operation)
    return Endpoint(adapter, named, stream=operation in STREAMING, sent_path=sent)


def _generates(segments: tuple[str, ...]) -> bool:
    """A path that reaches a model of Bedrock's (`.../model/{id}/converse`, `invoke`, streamed or not)."""
    return len(segments) >= 3 and segments[-3] == "model" and segments[-1] in _GENERATING


_GENERATING = frozenset(OPERATIONS) - {"count-tokens"}


def converse_shape(options: ShapeOptions) -> Shape:
    """Converse and ConverseStream, and CountTokens (either body) answered locally."""
    adapter, count = ConverseAdapter(), CountTokensAdapter()
    operations: dict[str, Adapter] = {"converse": adapter, "converse-stream": adapter, "count-tokens": count}
    match = functools.partial(_endpoint, operations)
    return Shape(adapter.name, (adapter, count), {}, match, _generates, reads_path=bedrock_path)


def invoke_shape(options: ShapeOptions) -> Shape:
    """InvokeModel and InvokeModelWithResponseStream, for Claude's Messages body."""
    adapter = InvokeAdapter()
    match = functools.partial(_endpoint, {"invoke": adapter, "invoke-with-response-stream": adapter})
    return Shape(adapter.name, (adapter,), {}, match, _generates, reads_path=bedrock_path)
