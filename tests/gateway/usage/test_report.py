"""The usage report over trails written by a real AuditTrail to rotating files: what counts,
what does not, prices, and trails that fail verification."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.audit import AuditTrail, RotatingFileSink, rotated_files
from gateway.usage import TrailRejected, UsageError, load_prices, parse_time, read_usage

KEY = Ed25519PrivateKey.generate()
NOW = time.time()


def _record(tenant: str, at: float, prompt: int, completion: int, *, deployment: str | None = "embedded",
            engine: dict | None = None) -> dict:
    record = {"tenant": tenant, "principal": tenant + "-p", "model": "demo", "deployment": deployment, "time": at,
              "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "cached_tokens": prompt // 2}}
    return record | ({"engine": engine} if engine else {})


def _trail(path: Path, records: list[dict], *, max_bytes: int = 100 << 20) -> list[Path]:
    with AuditTrail([RotatingFileSink(path, max_bytes=max_bytes, backup_count=50)], KEY, checkpoint_every=3) as trail:
        for record in records:
            trail.append(record)
    return rotated_files(path)


def test_records_are_summed_across_rotated_files_within_the_range(tmp_path) -> None:
    records = [_record("a", NOW + i, 10, 2, engine={"kv_block_seconds": 0.5, "engine_ms": 4.0}) for i in range(30)]
    records += [_record("b", NOW + 5, 7, 1)]  # an upstream deployment: no engine figures
    records += [_record("a", NOW + 6, 99, 0, deployment=None)]  # refused: it never ran
    records += [_record("a", NOW + 100, 99, 99)]  # after the range
    files = _trail(tmp_path / "audit.jsonl", records, max_bytes=2000)
    assert len(files) > 3  # the chain runs on across rotated files
    usage = read_usage(files, [KEY.public_key()], NOW, NOW + 30)
    report = usage.document()
    by_tenant = {row["tenant"]: row for row in report["rows"]}
    assert by_tenant["a"] == {"tenant": "a", "principal": "a-p", "model": "demo", "deployment": "embedded",
                              "requests": 30, "prompt_tokens": 300, "completion_tokens": 60, "cached_tokens": 150,
                              "kv_block_seconds": 15.0, "engine_ms": 120.0}
    assert by_tenant["b"]["requests"] == 1 and by_tenant["b"]["kv_block_seconds"] == 0
    assert report["totals"]["prompt_tokens"] == 307 and "cost" not in report["totals"]


def test_a_deleted_record_fails_the_report(tmp_path) -> None:
    files = _trail(tmp_path / "audit.jsonl", [_record("a", NOW, 1, 1) for _ in range(6)])
    lines = files[-1].read_text().splitlines()
    files[-1].write_text("\n".join(lines[:2] + lines[3:]) + "\n")  # one record cut out
    with pytest.raises(TrailRejected, match="tampered"):
        read_usage(files, [KEY.public_key()], NOW - 1, NOW + 1)


def test_another_key_fails_the_report(tmp_path) -> None:
    files = _trail(tmp_path / "audit.jsonl", [_record("a", NOW, 1, 1)])
    with pytest.raises(TrailRejected, match="invalid signature"):
        read_usage(files, [Ed25519PrivateKey.generate().public_key()], NOW - 1, NOW + 1)


def test_an_empty_range_or_trail_is_an_error(tmp_path) -> None:
    with pytest.raises(UsageError, match="range is empty"):
        read_usage([], [KEY.public_key()], NOW, NOW)
    with pytest.raises(UsageError, match="no audit entries"):
        read_usage([], [KEY.public_key()], NOW, NOW + 1)
    with pytest.raises(UsageError, match="cannot read"):
        read_usage([tmp_path / "missing.jsonl"], [KEY.public_key()], NOW, NOW + 1)


def test_times_are_iso_8601_and_utc_unless_they_say_otherwise() -> None:
    assert parse_time("2026-12-01", "--from") == parse_time("2026-12-01T00:00:00Z", "--from") == 1796083200
    assert parse_time("2026-12-01T01:00:00+01:00", "--to") == 1796083200
    with pytest.raises(UsageError, match="--from must be an ISO 8601"):
        parse_time("last tuesday", "--from")


def test_prices_are_validated_and_unpriced_models_have_no_cost(tmp_path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"models": {"demo": {"prompt_per_1m": -1}}}))
    with pytest.raises(UsageError, match="models.demo.prompt_per_1m"):
        load_prices(bad)
    bad.write_text(json.dumps({"models": {"demo": {"per_token": 1}}}))
    with pytest.raises(UsageError, match="per_token"):
        load_prices(bad)
    good = tmp_path / "prices.json"
    good.write_text(json.dumps({"models": {"other": {"prompt_per_1m": 1}}}))
    files = _trail(tmp_path / "audit.jsonl", [_record("a", NOW, 1_000_000, 0)])
    report = read_usage(files, [KEY.public_key()], NOW - 1, NOW + 1).document(load_prices(good))
    assert report["rows"][0]["cost"] is None and report["unpriced_models"] == ["demo"]
    assert report["currency"] == "USD" and report["totals"]["cost"] == 0
