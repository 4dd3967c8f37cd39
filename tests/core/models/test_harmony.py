"""gpt-oss's requests, counted as the harmony format renders them: openai-harmony (OpenAI's own
renderer, in the dev extra) renders each conversation here as vLLM and Bedrock do, with the
renderer's system message dated, a client's system message as a developer message and each
assistant message of the history on its `final` channel, and counts it with its o200k vocabulary
(read offline from the same o200k_base file the guard reads: `TIKTOKEN_ENCODINGS_BASE`)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.tokenizers.vocabularies import bundled_encodings_dir, encoding_file_name

CORPUS: dict[str, str] = json.loads((Path(__file__).parents[2] / "data/families/corpus.json").read_text("utf-8"))
Messages = list[dict[str, Any]]


@functools.cache
def _encoding(folder: str) -> Any:
    harmony = pytest.importorskip("openai_harmony")
    return harmony.load_harmony_encoding(harmony.HarmonyEncodingName.HARMONY_GPT_OSS)


@pytest.fixture(scope="module")
def harmony(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """openai-harmony's gpt-oss encoding, its o200k_base read from litellm's file (no download)."""
    folder = tmp_path_factory.mktemp("harmony")
    source = bundled_encodings_dir()
    assert source is not None, "litellm's tiktoken files are not installed"
    (folder / "o200k_base.tiktoken").symlink_to(source / encoding_file_name("o200k_base"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TIKTOKEN_ENCODINGS_BASE", str(folder))
        return _encoding(str(folder))


def rendered(harmony: Any, messages: Messages, date: str | None = "2026-11-28") -> int:
    """The tokens harmony renders for `messages` and the reply's opening."""
    import openai_harmony as h

    system = h.SystemContent.new()
    if date is not None:
        system = system.with_conversation_start_date(date)
    out = [h.Message.from_role_and_content(h.Role.SYSTEM, system)]
    for m in messages:
        if m["role"] in ("system", "developer"):
            instructions = h.DeveloperContent.new().with_instructions(m["content"])
            out.append(h.Message.from_role_and_content(h.Role.DEVELOPER, instructions))
        elif m["role"] == "user":
            out.append(h.Message.from_role_and_content(h.Role.USER, m["content"]))
        else:
            out.append(h.Message.from_role_and_content(h.Role.ASSISTANT, m["content"]).with_channel("final"))
    conversation = h.Conversation.from_messages(out)
    return len(harmony.render_conversation_for_completion(conversation, h.Role.ASSISTANT))


def _ours(counter_for: Any, messages: Messages, model: str = "gpt-oss-120b") -> Any:
    return counter_for(model).request({"model": model, "messages": messages})


CONVERSATIONS: dict[str, Messages] = {
    "hi": [{"role": "user", "content": "Hi"}],
    "system and user": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    "developer and user": [{"role": "developer", "content": "Answer in French."}, {"role": "user", "content": "Hi"}],
    "multi-turn": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4."},
        {"role": "user", "content": "And 3+3?"},
    ],
    "long": [
        {"role": "system", "content": CORPUS["prose_english"][:600]},
        {"role": "user", "content": "Summarise this file:\n" + CORPUS["code_python"]},
        {"role": "assistant", "content": CORPUS["prose_german"][:500]},
        {"role": "user", "content": "And these records?\n" + CORPUS["json_compact"][:1500]},
        {"role": "assistant", "content": CORPUS["prose_chinese"][:300]},
        {"role": "user", "content": "Thanks. " + CORPUS["logs"][:800]},
    ],
}


class TestGptOssInTheHarmonyFormat:
    @pytest.mark.parametrize("name", sorted(CONVERSATIONS))
    @pytest.mark.parametrize("model", ["gpt-oss-120b", "openai/gpt-oss-20b"])
    def test_a_conversation_counts_what_harmony_renders(self, harmony, counter_for, name, model):
        count = _ours(counter_for, CONVERSATIONS[name], model)
        assert count.total == rendered(harmony, CONVERSATIONS[name]) and count.exact

    def test_a_lone_hi_is_68_with_the_date_line_servers_write_and_57_without(self, harmony, counter_for):
        messages = CONVERSATIONS["hi"]
        assert (rendered(harmony, messages), rendered(harmony, messages, None)) == (68, 57)
        assert _ours(counter_for, messages).total == 68

    @pytest.mark.parametrize("date", ["2024-01-01", "2025-08-05", "2029-12-31", "2035-06-15"])
    def test_the_date_line_costs_the_same_on_any_date(self, harmony, counter_for, date):
        messages = CONVERSATIONS["system and user"]
        assert _ours(counter_for, messages).total == rendered(harmony, messages, date)
