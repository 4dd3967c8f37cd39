"""The `context-guard count` and `trim` commands."""

from __future__ import annotations

import io
import json
import random
import sys
from pathlib import Path

import pytest

from proxy.cli import main

EXAMPLES = Path(__file__).parents[2] / "examples"


def _run(capsys, monkeypatch, argv, stdin: str | None = None):
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin.encode())))
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _long_conversation(turns: int = 60) -> dict:
    messages = [{"role": "system", "content": "You are helpful."}]
    for i in range(turns):
        messages += [
            {"role": "user", "content": f"Question {i}: " + "tell me more about the history of rivers " * 20},
            {"role": "assistant", "content": f"Answer {i}: " + "rivers shaped the valleys over time " * 20},
        ]
    messages.append({"role": "user", "content": "Summarise."})
    return {"model": "gpt-4", "messages": messages}


class TestCount:
    def test_prints_the_report_with_the_budget(self, capsys, monkeypatch, tmp_path):
        path = tmp_path / "body.json"
        path.write_text(json.dumps({"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}))
        code, out, _ = _run(capsys, monkeypatch, ["count", str(path)])
        report = json.loads(out)
        assert code == 0
        assert report["prompt_tokens"] == 8 and report["context_window"] == 8192 and report["fits"] is True
        assert report["input_budget"] == 8192 - 1228 - 410
        assert set(report["components"]) >= {"system", "history", "latest_user", "images"}
        assert report["messages"] == [{"index": 0, "role": "user", "tokens": 5}]

    def test_reads_standard_input_and_takes_the_model_flag(self, capsys, monkeypatch):
        code, out, _ = _run(
            capsys,
            monkeypatch,
            ["count", "--model", "gpt-4o", "-"],
            json.dumps({"messages": [{"role": "user", "content": "hi"}]}),
        )
        assert code == 0 and json.loads(out)["context_window"] == 128000

    @pytest.mark.parametrize(
        ("stdin", "message"),
        [
            ("not json", "not valid JSON"),
            ('"text"', "JSON object"),
            ("[1, 2]", "messages[0] must be an object"),
            ('{"model": "gpt-4"}', "'messages' is required"),
            ('{"messages": [{"role": "user", "content": "x"}]}', "no model"),
        ],
    )
    def test_bad_input_is_one_line_and_exit_2(self, capsys, monkeypatch, stdin, message):
        code, out, err = _run(capsys, monkeypatch, ["count", "-"], stdin)
        assert code == 2 and out == "" and message in err and err.count("\n") == 1

    def test_a_request_over_budget_is_reported_as_given_with_what_trimming_would_do(self, capsys, monkeypatch):
        code, out, _ = _run(capsys, monkeypatch, ["count", "-"], json.dumps(_long_conversation()))
        report = json.loads(out)
        assert code == 0 and report["fits"] is False and report["overflow"] > 0
        assert report["prompt_tokens"] - report["input_budget"] == report["overflow"]
        assert report["after_trim"]["outcome"] == "trimmed" and report["after_trim"]["fits"] is True

    def test_a_bare_list_of_messages_is_read_as_a_body_with_a_note(self, capsys, monkeypatch):
        stdin = json.dumps([{"role": "user", "content": "hi"}])
        code, out, _ = _run(capsys, monkeypatch, ["count", "--model", "gpt-4", "-"], stdin)
        report = json.loads(out)
        assert code == 0 and report["prompt_tokens"] == 8 and "list of messages" in report["warnings"][0]

    def test_an_unknown_role_is_a_warning_in_the_report(self, capsys, monkeypatch):
        stdin = json.dumps({"model": "gpt-4", "messages": [{"role": "usr", "content": "hi"}]})
        code, out, _ = _run(capsys, monkeypatch, ["count", "-"], stdin)
        assert code == 0 and "'usr'" in json.loads(out)["warnings"][0]

    def test_a_missing_file_is_exit_2(self, capsys, monkeypatch, tmp_path):
        code, _, err = _run(capsys, monkeypatch, ["count", str(tmp_path / "nope.json")])
        assert code == 2 and "cannot read" in err


class TestTheRequestsNotes:
    """The notes of a request (what its adapter noted reading it, what its count bounded) reach the
    `count` and `trim` reports by one list, `notes`, each once; `warnings` says only how the file
    was read."""

    @pytest.mark.parametrize("command", ["count", "trim"])
    def test_the_adapters_and_the_counts_notes_are_in_notes_once(self, capsys, monkeypatch, command):
        letters = "".join(random.Random(1).choices("abcdefghijklmnopqrstuvwxyz", k=40_000))  # no word boundary
        body = {"model": "gpt-4o", "input": [{"role": "user", "content": letters}], "truncation": "auto"}
        code, out, _ = _run(capsys, monkeypatch, [command, "-"], json.dumps(body))
        report = json.loads(out) if command == "count" else json.loads(out)["report"]
        truncation = [n for n in report["notes"] if n.startswith("truncation: auto")]
        bounded = [n for n in report["notes"] if "40000 characters (no word boundary)" in n and "upper bound" in n]
        assert code == 0 and len(truncation) == 1 and len(bounded) == 1 and len(report["notes"]) == 2
        assert report["warnings"] == []

    def test_a_request_with_nothing_to_note_has_no_notes(self, capsys, monkeypatch):
        body = {"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}
        code, out, _ = _run(capsys, monkeypatch, ["count", "-"], json.dumps(body))
        assert code == 0 and json.loads(out)["notes"] == []


class TestEveryApiShape:
    def test_a_responses_body_is_detected_and_counted_like_its_chat_twin(self, capsys, monkeypatch):
        chat = {"model": "gpt-4o", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}
        responses = {"model": "gpt-4o", "instructions": "Be brief.", "input": "hi"}
        _, chat_out, _ = _run(capsys, monkeypatch, ["count", "-"], json.dumps(chat))
        code, out, _ = _run(capsys, monkeypatch, ["count", "-"], json.dumps(responses))
        report = json.loads(out)
        assert code == 0 and report["api"] == "responses"
        assert report["prompt_tokens"] == json.loads(chat_out)["prompt_tokens"]

    def test_an_anthropic_messages_body_over_budget_is_trimmed_in_its_own_shape(self, capsys, monkeypatch):
        turns = [{"role": r, "content": f"{r} turn {i}: " + "the river runs to the sea " * 40} for i in range(40) for r in ("user", "assistant")]
        body = {"model": "claude-sonnet-4-5", "max_tokens": 512, "system": "Be brief.", "messages": [*turns, {"role": "user", "content": "latest"}]}
        code, out, _ = _run(capsys, monkeypatch, ["trim", "--api", "messages", "--context-window", "4000", "-"], json.dumps(body))
        result = json.loads(out)
        assert code == 0 and result["report"]["api"] == "messages" and result["report"]["outcome"] == "trimmed"
        assert result["body"]["system"] == "Be brief." and result["body"]["messages"][0]["role"] == "user"
        assert result["body"]["messages"][-1]["content"] == "latest" and "max_tokens" in result["body"]

    def test_a_body_that_is_not_of_the_named_shape_is_one_line_and_exit_2(self, capsys, monkeypatch):
        code, out, err = _run(capsys, monkeypatch, ["count", "--api", "responses", "-"], json.dumps({"model": "gpt-4o", "input": 5}))
        assert code == 2 and out == "" and "not a valid responses request" in err and err.count("\n") == 1


class TestCommandLine:
    def test_prints_its_version(self, capsys):
        with pytest.raises(SystemExit) as done:
            main(["--version"])
        assert done.value.code == 0 and capsys.readouterr().out.startswith("context-guard ")

    def test_trim_help_lists_the_exit_codes(self, capsys):
        with pytest.raises(SystemExit):
            main(["trim", "--help"])
        help_text = " ".join(capsys.readouterr().out.split())
        assert "0 fits (or was cut to fit), 3 rejected by the overflow policy, 2 bad input or config" in help_text


class TestCheckConfig:
    @pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
    def test_every_example_config_is_valid_and_printed_with_secrets_masked(self, capsys, monkeypatch, path):
        for name, value in {"OPENAI_API_KEY": "sk-secret", "VERTEX_PROJECT": "p", "VERTEX_LOCATION": "l", "CONTEXT_GUARD_KEY": "cg-secret"}.items():
            monkeypatch.setenv(name, value)
        code, out, _ = _run(capsys, monkeypatch, ["check-config", str(path)])
        assert code == 0 and json.loads(out)["valid"] is True
        assert "cg-secret" not in out and "sk-secret" not in out

    def test_a_bad_config_is_one_line_naming_file_and_key_and_exit_2(self, capsys, monkeypatch, tmp_path):
        (tmp_path / "bad.yaml").write_text("trim:\n  options:\n    shrink_messages: {cap: big}\n")
        code, out, err = _run(capsys, monkeypatch, ["check-config", str(tmp_path / "bad.yaml")])
        assert code == 2 and out == "" and err.count("\n") == 1
        assert "bad.yaml: trim.options.shrink_messages.cap: must be a whole number" in err

    def test_a_tokenizer_that_cannot_load_names_the_key_and_the_encodings_on_disk(self, capsys, monkeypatch, tmp_path):
        (tmp_path / "t.yaml").write_text('models:\n  overrides:\n    - {match: m, tokenizer: "tiktoken:p50k*1.1"}\n')
        code, _, err = _run(capsys, monkeypatch, ["check-config", str(tmp_path / "t.yaml")])
        assert code == 2 and "t.yaml: models.overrides[0].tokenizer:" in err and "o200k_base" in err


class TestTrim:
    def test_a_long_conversation_is_cut_to_fit_with_exit_0(self, capsys, monkeypatch):
        code, out, _ = _run(capsys, monkeypatch, ["trim", "-"], json.dumps(_long_conversation()))
        result = json.loads(out)
        assert code == 0
        assert result["report"]["outcome"] == "trimmed"
        assert result["report"]["tokens_after"] <= result["report"]["budget"]["input_budget"]
        assert result["body"]["messages"][0]["role"] == "system"
        assert result["body"]["messages"][-1]["content"] == "Summarise."
        assert all(r["kind"] == "dropped" for r in result["report"]["removed"])

    def test_the_context_window_flag_overrides_the_model(self, capsys, monkeypatch):
        body = {"model": "gpt-4o", "messages": _long_conversation(10)["messages"]}
        code, out, _ = _run(capsys, monkeypatch, ["trim", "--context-window", "4000", "-"], json.dumps(body))
        assert code == 0 and json.loads(out)["report"]["budget"]["context_window"] == 4000

    def test_a_request_that_cannot_fit_is_rejected_with_exit_3(self, capsys, monkeypatch):
        body = {
            "model": "gpt-4",
            "messages": [{"role": "system", "content": "rule " * 9000}, {"role": "user", "content": "hi"}],
        }
        code, out, err = _run(capsys, monkeypatch, ["trim", "-"], json.dumps(body))
        result = json.loads(out)
        assert code == 3 and result["report"]["outcome"] == "rejected"
        assert "input budget is 6,554 tokens" in result["report"]["error"]
        assert result["body"] == body
        assert err == f"context-guard: rejected: {result['report']['error']}\n"

    def test_a_request_that_fits_says_nothing_on_stderr(self, capsys, monkeypatch):
        body = {"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}
        code, _, err = _run(capsys, monkeypatch, ["trim", "-"], json.dumps(body))
        assert code == 0 and err == ""
