"""`tenantgate cache segment`: the digest policy data takes, for exactly the tokens requests start with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine import Tokenizer, resolve_model_path, segment_digest
from gateway.main import main

SYSTEM = [{"role": "system", "content": "You are the platform's assistant. Answer in plain words."}]


@pytest.fixture(scope="module")
def demo_tokenizer() -> Tokenizer:
    return Tokenizer.from_dir(resolve_model_path("demo", progress=False))


def segment(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main(["cache", "segment", "--model", "demo", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_system_prompts_digest_covers_the_tokens_a_chat_request_starts_with(
        tmp_path: Path, demo_tokenizer: Tokenizer, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "system.json").write_text(json.dumps(SYSTEM))
    printed = segment(capsys, "--messages", str(tmp_path / "system.json"))
    request = demo_tokenizer.encode_chat([*SYSTEM, {"role": "user", "content": "What is on the agenda?"}])
    assert printed["digest"] == segment_digest(request[: printed["tokens"]]).hex()
    assert printed["shared_tokens"] == printed["tokens"] // 16 * 16 > 0
    # Another system prompt, another digest.
    (tmp_path / "other.json").write_text(json.dumps([{"role": "system", "content": "Answer in French."}]))
    assert segment(capsys, "--messages", str(tmp_path / "other.json"))["digest"] != printed["digest"]


def test_a_completion_prompts_digest_covers_its_text(tmp_path: Path, demo_tokenizer: Tokenizer,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    text = "Summarise the following meeting notes for the board in three short points:\n"
    (tmp_path / "prompt.txt").write_text(text)
    printed = segment(capsys, "--text", str(tmp_path / "prompt.txt"))
    ids = demo_tokenizer.encode(text)
    assert printed == {"digest": segment_digest(ids).hex(), "tokens": len(ids), "shared_tokens": len(ids) // 16 * 16}


@pytest.mark.parametrize(("content", "problem"), [
    ("{not json", "is not JSON"),
    ('{"role": "system"}', "must hold a JSON array of objects"),
    ("[]", "needs at least one message"),
])
def test_unusable_messages_are_refused_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       content: str, problem: str) -> None:
    (tmp_path / "m.json").write_text(content)
    assert main(["cache", "segment", "--model", "demo", "--messages", str(tmp_path / "m.json")]) == 2
    err = capsys.readouterr().err
    assert problem in err and "Traceback" not in err


def test_a_missing_file_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "segment", "--model", "demo", "--text", str(tmp_path / "absent.txt")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_the_example_platform_segment_is_the_default_models_rendering_of_its_messages(smollm2_dir: Path) -> None:
    from gateway.cache.segment import segment_tokens
    from gateway.policy.loader import DEFAULT_POLICY_DIR

    example = json.loads((DEFAULT_POLICY_DIR / "data" / "platform_segments.example.json").read_text())
    assistant = example["platform_segments"]["assistant"]
    ids = segment_tokens(Tokenizer.from_dir(smollm2_dir), assistant["messages"])
    assert (segment_digest(ids).hex(), len(ids)) == (assistant["digest"], assistant["tokens"])
