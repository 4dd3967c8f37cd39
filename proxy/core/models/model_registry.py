"""Model profiles: each model's context window, output limit, tokenizer, chat format and image prices.

Windows come from a model map (litellm's bundled `model_prices_and_context_window` JSON, read
by the shell and handed in as a plain dict), overridden by the operator's config. Everything
else comes from the model's family, matched by name. An unknown model gets a configurable
conservative window and is flagged, never silently trusted.
"""

from __future__ import annotations

import fnmatch
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, TypeVar

from proxy.core.costs.images import ImageCostScheme, PatchCost, TileCost
from proxy.core.models.families import OPEN_FAMILIES, UNKNOWN_FAMILY, Family
from proxy.core.models.families import ChatFormat as ChatFormat  # re-exported: the profile's type
from proxy.core.models.families import TokenizerSpec as TokenizerSpec
from proxy.core.models.open_windows import documented_window, maker_provider

O200K_FORMAT = ChatFormat()
# gpt-3.5-turbo-1106/0125 and gpt-4-turbo: the same framing as far as it was measured; their calls
# were not, so they take today's call framing (the larger) and say so.
CL100K_FORMAT = replace(O200K_FORMAT, calls_measured=False)
# Reasoning models (gpt-5, the o-series, gpt-oss) show tools inside a larger, unpublished frame:
# pydantic-ai's recorded exchanges (2025-08 to 2026-03) put gpt-5, gpt-5-mini and gpt-5.4-mini
# 81 to 86 tokens above the namespace rendering with tools, and a call with its result up to 6
# above today's call framing. Both are bounded by the largest gap seen and flagged.
# Their replies are primed with one token fewer than gpt-4o's (`<|start|>assistant`, 2 tokens):
# measured on gpt-5, gpt-5.6 and o3-mini (one to three messages, with and without a system one).
REASONING_FORMAT = replace(
    O200K_FORMAT,
    reply_priming=2,
    functions_overhead=9 + 86,
    function_call_overhead=6 + 6,
    tools_measured=False,
    calls_measured=False,
)
# gpt-5 on the Responses API writes each assistant message of the history with its channel
# (`<|channel|>final`, 2 tokens): two recorded histories with two assistant messages each.
GPT5_FORMAT = replace(REASONING_FORMAT, responses_assistant=2)
# Reasoning models whose plain messages no recording shows (gpt-5-mini/nano, o1, o3, o4-mini,
# gpt-oss): gpt-4o's priming, one above the measured reasoning models' if they share it.
REASONING_UNMEASURED_FORMAT = replace(
    REASONING_FORMAT,
    reply_priming=3,
    functions_overhead=9 + 85,
    responses_assistant=2,
    messages_bound="this model's message framing is not measured: counted with gpt-4o's reply priming (the larger)",
)
# gpt-oss speaks the harmony format (openai-harmony renders it; vLLM, Bedrock and the model's own
# chat template write the same): every request opens with the renderer's system message (identity,
# knowledge cutoff, the conversation's date, reasoning level, channels: 61 tokens with its frame for
# any date of 2024-2035), a client's system or developer message becomes a developer message under
# "# Instructions\n\n" (3 more), an assistant message of the history carries its channel
# (`<|channel|>final`, 2 more), and the reply opens `<|start|>assistant` (2). A lone "Hi" is 68
# (57 without the date line, which the renderer adds when given a date and the servers always give);
# Bedrock's recorded `openai.gpt-oss-120b` request is 72, as counted. tests/core/models/test_harmony.py
# renders conversations with openai-harmony itself.
GPT_OSS_FORMAT = replace(
    REASONING_UNMEASURED_FORMAT,
    reply_priming=2 + 61,
    role_extra=(("system", 3), ("developer", 3), ("assistant", 2)),
    responses_assistant=0,  # the channel is in role_extra already
    messages_bound="",
)
# gpt-4.1-mini on the Responses API: a plain user message recorded 1 above chat's framing, an
# empty one with instructions equal to it; bounded by the larger.
GPT41_MINI_FORMAT = replace(
    O200K_FORMAT,
    responses_extra=1,
    responses_bound="gpt-4.1-mini's Responses framing: measured 0 and 1 above chat's, bounded by the larger",
)
# o1-mini and o1-preview reject `system` and `developer` messages (the API answers 400), and their
# one recorded request (two user messages) costs 8 more than the reasoning framing: whether per
# request or per message is unknown, so both are bounded (4 per message and 4 more per request).
O1_MINI_FORMAT = replace(
    REASONING_FORMAT,
    per_message=3 + 4,
    reply_priming=2 + 4,
    messages_bound="o1-mini's message framing is not published: bounded by its one recorded request (8 above)",
)
# Search-preview models report prompt_tokens without the chat framing (content tokens alone, on
# both recorded requests): the framing the model is shown cannot be checked, so it is counted.
SEARCH_PREVIEW_FORMAT = replace(
    O200K_FORMAT,
    messages_bound="search-preview models report their content tokens alone: counted with the chat framing",
)
# The 0613 models (gpt-4, which still points at gpt-4-0613, and gpt-3.5-turbo-0613, retired):
# where the open-source counters measured calls, parallel calls and their results in 2023.
FORMAT_0613 = ChatFormat(function_call_overhead=3, parallel_calls_measured=True)
LEGACY_0301_FORMAT = ChatFormat(per_message=4, per_name=-1)
def _tiktoken(name: str, multiplier: float = 1.0) -> TokenizerSpec:
    return TokenizerSpec("tiktoken", name, multiplier)


_OPENAI_TILES = TileCost(85, 170)
# Name patterns, matched against the normalised name (`family_names`), first match wins. OpenAI
# image prices are the published per-model values. Other families: `proxy.core.models.families`.
FAMILIES: tuple[tuple[str, Family], ...] = (
    ("gpt-3.5-turbo-0301*", Family(_tiktoken("cl100k_base"), LEGACY_0301_FORMAT, _OPENAI_TILES, True)),
    ("gpt-3.5-turbo-0613*", Family(_tiktoken("cl100k_base"), FORMAT_0613, _OPENAI_TILES, True)),
    ("gpt-3.5-turbo-16k-0613*", Family(_tiktoken("cl100k_base"), FORMAT_0613, _OPENAI_TILES, True)),
    ("gpt-4-0613*", Family(_tiktoken("cl100k_base"), FORMAT_0613, _OPENAI_TILES, True)),
    ("gpt-4-32k-0613*", Family(_tiktoken("cl100k_base"), FORMAT_0613, _OPENAI_TILES, True)),
    ("gpt-4", Family(_tiktoken("cl100k_base"), FORMAT_0613, _OPENAI_TILES, True)),
    ("gpt-4-32k", Family(_tiktoken("cl100k_base"), FORMAT_0613, _OPENAI_TILES, True)),
    ("gpt-4o*search*", Family(_tiktoken("o200k_base"), SEARCH_PREVIEW_FORMAT, _OPENAI_TILES, True)),
    ("gpt-4o-mini*", Family(_tiktoken("o200k_base"), O200K_FORMAT, TileCost(2833, 5667), True)),
    ("gpt-4o*", Family(_tiktoken("o200k_base"), O200K_FORMAT, _OPENAI_TILES, True)),
    ("chatgpt-4o*", Family(_tiktoken("o200k_base"), O200K_FORMAT, _OPENAI_TILES, True)),
    ("gpt-4.1-mini*", Family(_tiktoken("o200k_base"), GPT41_MINI_FORMAT, PatchCost(1.62), True)),
    ("gpt-4.1-nano*", Family(_tiktoken("o200k_base"), O200K_FORMAT, PatchCost(2.46, per_image=1), True)),
    ("gpt-4.1*", Family(_tiktoken("o200k_base"), O200K_FORMAT, _OPENAI_TILES, True)),
    ("gpt-4.5*", Family(_tiktoken("o200k_base"), O200K_FORMAT, _OPENAI_TILES, True)),
    ("gpt-5-mini*", Family(_tiktoken("o200k_base"), REASONING_UNMEASURED_FORMAT, PatchCost(1.62), True)),
    ("gpt-5-nano*", Family(_tiktoken("o200k_base"), REASONING_UNMEASURED_FORMAT, PatchCost(2.46), True)),
    ("gpt-5*", Family(_tiktoken("o200k_base"), GPT5_FORMAT, TileCost(70, 140), True)),
    ("o4-mini*", Family(_tiktoken("o200k_base"), REASONING_UNMEASURED_FORMAT, PatchCost(1.72), True)),
    ("o1-mini*", Family(_tiktoken("o200k_base"), O1_MINI_FORMAT, TileCost(75, 150), True)),
    ("o1-preview*", Family(_tiktoken("o200k_base"), O1_MINI_FORMAT, TileCost(75, 150), True)),
    ("o1*", Family(_tiktoken("o200k_base"), REASONING_UNMEASURED_FORMAT, TileCost(75, 150), True)),
    ("o3-mini*", Family(_tiktoken("o200k_base"), REASONING_FORMAT, TileCost(75, 150), True)),
    ("o3*", Family(_tiktoken("o200k_base"), REASONING_UNMEASURED_FORMAT, TileCost(75, 150), True)),
    ("*gpt-oss*", Family(_tiktoken("o200k_base"), GPT_OSS_FORMAT, _OPENAI_TILES, True)),
    ("gpt-4*", Family(_tiktoken("cl100k_base"), CL100K_FORMAT, _OPENAI_TILES, True)),
    ("gpt-3.5*", Family(_tiktoken("cl100k_base"), CL100K_FORMAT, _OPENAI_TILES, True)),
    *OPEN_FAMILIES,
)


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """Everything the core needs to know about one model."""

    name: str  # as requested
    matched: str | None  # the model-map key or config entry it resolved to; None when unknown
    context_window: int
    max_output_tokens: int | None
    tokenizer: TokenizerSpec
    chat_format: ChatFormat
    images: ImageCostScheme
    window_source: Literal["config", "model_map", "model_card", "fallback"]
    tokenizer_exact: bool
    rules_hash: int = field(init=False, repr=False, compare=False)  # in every count-cache key: hashed once

    def __post_init__(self) -> None:
        object.__setattr__(self, "rules_hash", hash((self.chat_format, self.images)))

    @property
    def known(self) -> bool:
        return self.window_source != "fallback"


@dataclass(frozen=True, slots=True)
class ModelOverride:
    """An operator's entry for a model name or glob: any field left None keeps the looked-up value."""

    pattern: str
    context_window: int | None = None
    max_output_tokens: int | None = None
    tokenizer: TokenizerSpec | None = None
    alias_of: str | None = None  # count and budget this model as if it were that one


# The profile cache: names kept at most, and the longest name kept (a longer one is resolved each time).
CACHED_NAMES = 4096
CACHED_NAME_CHARS = 256
V = TypeVar("V")


def _keep(cache: OrderedDict[str, V], name: str, value: V) -> None:
    """`value` kept under `name`, a client's model name: past `CACHED_NAMES` the oldest goes (an
    ordered dict pops it in O(1)), so a cache that clients filled with names nobody sends again
    keeps serving the ones that come next."""
    if len(name) > CACHED_NAME_CHARS:
        return
    if len(cache) >= CACHED_NAMES:
        cache.popitem(last=False)
    cache[name] = value


_DATE_SUFFIXES = (
    re.compile(r"-\d{4}-\d{2}-\d{2}$"),  # gpt-4o-2024-08-06
    re.compile(r"[-@]\d{8}$"),  # claude-3-5-sonnet-20240620, claude-3-opus@20240229
    re.compile(r"-\d{4}$"),  # gpt-4-0613
    re.compile(r"-\d{3}$"),  # gemini-1.5-pro-002
    re.compile(r"-v\d+(:\d+)?$"),  # bedrock style -v1:0
)
# A Bedrock inference profile's region prefix on its foundation model's id (`us.anthropic.`).
BEDROCK_PROFILE = re.compile(r"^(?:us|us-gov|eu|apac|jp|au|ca|global)\.(?=[a-z0-9-]+\.[a-z0-9])")


def name_candidates(name: str) -> list[str]:
    """The names to try, most specific first: as given, lower-cased, a fine-tune's base model, without
    provider prefixes (`openai/`, `vertex_ai/`, `models/`, Bedrock's `us.`), then without a date or version."""
    seen: dict[str, None] = {}
    lowered = name.strip().lower()
    bases = [name.strip(), lowered]
    if lowered.startswith("ft:"):  # OpenAI fine-tunes: ft:gpt-4o-mini-2024-07-18:org::id
        base = lowered[3:].split(":", 1)[0]
        if base:
            bases.append(base)
    if "/" in lowered:
        bases += [lowered.split("/", 1)[1], lowered.rsplit("/", 1)[1]]
    bases += [BEDROCK_PROFILE.sub("", b) for b in bases if BEDROCK_PROFILE.match(b)]
    for base in bases:
        seen.setdefault(base, None)
    for base in list(seen):
        for pattern in _DATE_SUFFIXES:
            stripped = pattern.sub("", base)
            if stripped != base and stripped:
                seen.setdefault(stripped, None)
    return list(seen)


def override_names(name: str) -> list[str]:
    """The forms of `name` an override is matched against, most specific first: the model map's
    lookup names (`name_candidates`), the name itself included. Only suffixes and prefixes are
    stripped, never added: a name never becomes a more specific one."""
    return [name, *(candidate for candidate in name_candidates(name) if candidate != name)]


def family_names(name: str) -> list[str]:
    """The names a family is matched on: lower-cased, without any organisation or provider prefix
    (`meta-llama/`, `openrouter/mistralai/`, `fireworks_ai/accounts/fireworks/models/`), so that
    an organisation's name (`meta-llama`, `mistralai`) never picks another model's family."""
    bare = (c.rsplit("/", 1)[-1] for c in name_candidates(name) if c == c.lower())
    return list(dict.fromkeys(c for c in bare if c))


def family_for(name: str) -> Family:
    for candidate in family_names(name):
        for pattern, family in FAMILIES:
            if fnmatch.fnmatchcase(candidate, pattern):
                return family
    return UNKNOWN_FAMILY


@dataclass(frozen=True)
class ModelRegistry:
    """Resolves a requested model name to its profile. Built once; lookups are pure."""

    model_map: Mapping[str, Mapping[str, Any]]
    overrides: tuple[ModelOverride, ...] = ()
    fallback_window: int = 8192
    _cache: OrderedDict[str, ModelProfile] = field(default_factory=OrderedDict, compare=False, repr=False)
    _by_bare_name: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    _override_cache: OrderedDict[str, ModelOverride | None] = field(
        default_factory=OrderedDict, compare=False, repr=False
    )
    _by_host: dict[tuple[str, str], str] = field(default_factory=dict, compare=False, repr=False)
    _keys: dict[str, str] = field(default_factory=dict, compare=False, repr=False)
    _hosts: set[str] = field(default_factory=set, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Providers list the same model under their own prefixes (`vertex_ai/claude-...@2024...`,
        # `groq/llama-...`). Every chat entry is indexed by its lower-cased key, by its host and
        # bare name, and by its bare name alone; where several share one, the smallest window
        # wins, so a guess never overshoots.
        for key, entry in self.model_map.items():
            if not _is_chat(entry) or not _window_of(entry):
                continue
            lowered = key.lower()
            self._keys.setdefault(lowered, key)
            host = lowered.split("/", 1)[0] if "/" in lowered else ""
            self._hosts.add(host)
            bare = lowered.rsplit("/", 1)[-1]
            for name in {bare, bare.replace("@", "-")}:
                if self._smaller(entry, self._by_bare_name.get(name)):
                    self._by_bare_name[name] = key
                if self._smaller(entry, self._by_host.get((host, name))):
                    self._by_host[(host, name)] = key

    def _smaller(self, entry: Mapping[str, Any], current: str | None) -> bool:
        return current is None or _window_of(entry) < _window_of(self.model_map[current])

    def profile(self, name: str) -> ModelProfile:
        cached = self._cache.get(name)
        if cached is None:
            cached = self._resolve(name, depth=0)
            _keep(self._cache, name, cached)  # model names come from clients: how many, how long, bounded
        return cached

    def _resolve(self, name: str, depth: int) -> ModelProfile:
        override = self.override_for(name)
        if override is not None and override.alias_of and depth < 4:
            target = self._resolve(override.alias_of, depth + 1)
            return self._apply(replace(target, name=name), override)
        family = family_for(name)
        profile = ModelProfile(
            name=name,
            matched=None,
            context_window=self.fallback_window,
            max_output_tokens=None,
            tokenizer=family.tokenizer,
            chat_format=family.chat_format,
            images=family.images,
            window_source="fallback",
            tokenizer_exact=family.exact,
        )
        found = self._map_entry(name)
        if found is not None:
            entry_key, entry, source = found
            profile = replace(
                profile,
                matched=entry_key,
                context_window=_window_of(entry),
                max_output_tokens=_positive_int(entry.get("max_output_tokens")),
                window_source=source,
            )
        return self._apply(profile, override) if override is not None else profile

    def override_for(self, name: str) -> ModelOverride | None:
        """The operator's override for `name`: the first that matches the name as written, else the
        first that matches one of its normalised forms, most specific first (`override_names`). So
        an override for `gpt-4o` also holds `gpt-4o-2024-08-06`, `openai/gpt-4o`, `"gpt-4o "` and
        `ft:gpt-4o:org::id`, while one for `gpt-4o-2024-08-06` holds no other version."""
        if not self.overrides:
            return None
        if name in self._override_cache:
            return self._override_cache[name]
        found = next(
            (
                override
                for candidate in override_names(name)
                for override in self.overrides
                if override.pattern == candidate or fnmatch.fnmatchcase(candidate.lower(), override.pattern.lower())
            ),
            None,
        )
        _keep(self._override_cache, name, found)
        return found

    @staticmethod
    def _apply(profile: ModelProfile, override: ModelOverride) -> ModelProfile:
        if override.context_window is not None:
            profile = replace(
                profile, context_window=override.context_window, window_source="config", matched=override.pattern
            )
        if override.max_output_tokens is not None:
            profile = replace(profile, max_output_tokens=override.max_output_tokens)
        if override.tokenizer is not None:
            exact = override.tokenizer.multiplier == 1.0 and override.tokenizer.kind not in ("estimate", "bound")
            profile = replace(profile, tokenizer=override.tokenizer, tokenizer_exact=exact)
        return profile

    def _map_entry(self, name: str) -> tuple[str, Mapping[str, Any], Literal["model_map", "model_card"]] | None:
        """The entry whose window `name` takes. A name led by a host the map knows (`together_ai/`,
        `groq/`, `openrouter/`) takes that host's entry; any other (`Llama-3.1-8B-Instruct`,
        `meta-llama/...`, `gpt-4o`) is the model itself: its own key, else the window its maker
        documents (`proxy.core.models.open_windows`), else the maker's own API entry. Another host's entry
        is taken last, for a name known nowhere else, and then the smallest of them."""
        lowered = name.strip().lower()
        host, _, rest = lowered.partition("/")
        if rest and host in self._hosts and host not in _ORGS:
            key = self._keys.get(lowered) or self._by_host.get((host, rest.rsplit("/", 1)[-1]))
            if key is not None:
                return key, self.model_map[key], "model_map"
            lowered = rest  # the host has no entry for it: the model as its maker names it
        candidates = name_candidates(lowered)
        for candidate in candidates:
            key = self._keys.get(candidate)
            if key is not None and (candidate.count("/") == 0 or candidate == lowered):
                return key, self.model_map[key], "model_map"
        organisation, _, model = lowered.rpartition("/")
        organisation = organisation.rsplit("/", 1)[-1]
        documented = documented_window(model)
        if documented is not None:
            window, source = documented
            return f"model card: {source}", {"max_input_tokens": window}, "model_card"
        maker = maker_provider(organisation, model)
        key = self._by_host.get((maker, model)) if maker is not None else None
        if key is not None:
            return key, self.model_map[key], "model_map"
        for candidate in candidates:
            for bare in (candidate.rsplit("/", 1)[-1], candidate.rsplit("/", 1)[-1].replace("@", "-")):
                if bare in self._by_bare_name:
                    key = self._by_bare_name[bare]
                    return key, self.model_map[key], "model_map"
        return None


# Organisations that publish weights: a name led by one is the model, not a host's listing of it.
_ORGS = frozenset({"meta-llama", "mistralai", "qwen", "google", "deepseek-ai", "microsoft", "nvidia", "models"})


def _is_chat(entry: object) -> bool:
    return isinstance(entry, Mapping) and entry.get("mode", "chat") in ("chat", "responses", "completion")


def _window_of(entry: Mapping[str, Any]) -> int:
    return _positive_int(entry.get("max_input_tokens")) or _positive_int(entry.get("max_tokens")) or 0


def _positive_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
