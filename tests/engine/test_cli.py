from __future__ import annotations

import subprocess
import sys


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_generate_streams_a_continuation(tiny_dir) -> None:
    result = run_cli("generate", "--model", str(tiny_dir), "--prompt", "The gateway", "--max-tokens", "8",
                     "--temperature", "0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    again = run_cli("generate", "--model", str(tiny_dir), "--prompt", "The gateway", "--max-tokens", "8",
                    "--temperature", "0")
    assert again.stdout == result.stdout


def test_bad_input_is_a_clear_error_without_a_traceback(tiny_dir, tmp_path) -> None:
    cases = [
        (["--max-tokens", "0"], "max_tokens: must be a positive integer"),
        (["--temperature", "-1"], "temperature: must be >= 0"),
        (["--top-p", "1.5"], "top_p: must be in (0, 1]"),
    ]
    for extra, message in cases:
        result = run_cli("generate", "--model", str(tiny_dir), "--prompt", "x", *extra)
        assert result.returncode == 2
        assert message in result.stderr
        assert "Traceback" not in result.stderr
    missing = run_cli("generate", "--model", str(tmp_path / "nope"), "--prompt", "x")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr and "nope" in missing.stderr


def test_chat_flag_needs_a_template(tiny_dir) -> None:
    result = run_cli("generate", "--model", str(tiny_dir), "--prompt", "hi", "--chat")
    assert result.returncode == 2
    assert "chat template" in result.stderr
    assert "Traceback" not in result.stderr


def test_demo_model_generates_with_chat_template(demo_model_dir) -> None:
    # The subprocess inherits TENANTGATE_CACHE_DIR, so "demo" resolves to the session's build.
    result = run_cli("generate", "--model", "demo", "--prompt", "Hello", "--chat", "--max-tokens", "6", "--seed", "1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()


def test_generate_serves_smollm2_with_default_flags(smollm2_dir) -> None:
    # An 8k-context model in the default 256 MiB KV cache: served with what the cache holds, not refused.
    result = run_cli("generate", "--chat", "--prompt", "What is the capital of France?", "--temperature", "0",
                     "--max-tokens", "12")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "The capital of France is Paris."
