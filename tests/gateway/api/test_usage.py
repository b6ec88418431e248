"""Usage and chargeback over a real gateway: requests with known token counts (the openai SDK,
several tenants and principals), then `tenantgate usage report` (a subprocess) and
GET /admin/usage on the operator listener, which must match the client's counts exactly;
and a trail with one record edited, which both refuse to bill."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import httpx
import openai
import pytest

from devkit.server import TENANTGATE, gateway_env, serving
from engine import EngineConfig, LLMEngine
from gateway.app import create_app
from gateway.audit import load_or_create_signing_key, public_key_pem
from gateway.inference import EngineBackend
from gateway.operator import OPERATOR_ROLE
from tests.gateway.api.conftest import ALPHA, AUDIENCE, GAMMA, PLATFORM, THETA, gateway_settings

CHAT = [{"role": "user", "content": "Give me three words about the sea, and then three about the mountains."}]
PRINCIPALS = [(ALPHA, "0a000000-0000-4000-8000-000000000001"), (ALPHA, "0a000000-0000-4000-8000-000000000002"),
              (GAMMA, "0c000000-0000-4000-8000-000000000001"), (THETA, "07000000-0000-4000-8000-000000000001")]
FIGURES = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat()


@pytest.fixture(scope="module")
def metered(local_issuer, demo_model_dir, tmp_path_factory) -> Iterator[SimpleNamespace]:
    """A gateway of its own (its trail gets tampered with), and the usage its clients were told."""
    root = tmp_path_factory.mktemp("usage")
    settings = gateway_settings(local_issuer, audit_file=root / "audit.jsonl", audit_signing_key=root / "audit.pem")
    engine = LLMEngine(EngineConfig(model=str(demo_model_dir), kv_cache_memory_bytes=16 << 20, max_num_seqs=8,
                                    max_model_len=1024))
    app = create_app(settings, backend=EngineBackend(engine, model_name="demo"))
    with serving(app) as base_url:
        state = app.state.gateway
        (root / "audit.pub.pem").write_bytes(public_key_pem(load_or_create_signing_key(settings.audit_signing_key)))
        start = time.time()
        told = defaultdict(Counter)  # (tenant digest, principal digest) -> what the clients were told
        for i, (tenant, object_id) in enumerate(PRINCIPALS):
            key = tuple(state.audit.principal_digests(SimpleNamespace(tenant_id=tenant, object_id=object_id)).values())
            token = local_issuer.mint(tenant, audience=AUDIENCE, object_id=object_id)
            with openai.OpenAI(base_url=base_url + "/v1", api_key=token, max_retries=0, timeout=60) as client:
                for max_tokens in (3, 5 + i):  # the same prompt twice: the second hits the tenant's cache
                    usage = client.chat.completions.create(model="demo", messages=CHAT, max_tokens=max_tokens,
                                                           temperature=0).usage
                    _count(told[key], usage)
                chunks = client.chat.completions.create(model="demo", messages=CHAT, max_tokens=4, stream=True,
                                                        stream_options={"include_usage": True})
                _count(told[key], [c.usage for c in chunks if c.usage is not None][0])
                _count(told[key], client.completions.create(model="demo", prompt="the sea", max_tokens=2 + i).usage)
        state.audit.trail.checkpoint()  # signed: the report rests on a checkpoint, not an unsigned tail
        end = time.time() + 1
        yield SimpleNamespace(base_url=base_url, admin_url=f"http://127.0.0.1:{settings.metrics_port}/admin/usage",
                              settings=settings, root=root, told=told, start=start, end=end, issuer=local_issuer)
        state.backend.async_engine.shutdown()


def _count(counter: Counter, usage) -> None:
    counter["requests"] += 1
    counter["prompt_tokens"] += usage.prompt_tokens
    counter["completion_tokens"] += usage.completion_tokens
    counter["cached_tokens"] += usage.prompt_tokens_details.cached_tokens


def _report(metered, *args: str) -> subprocess.CompletedProcess:
    env = gateway_env(TENANTGATE_AUDIT_FILE=str(metered.settings.audit_file))
    return subprocess.run([TENANTGATE, "usage", "report", "--from", _iso(metered.start), "--to", _iso(metered.end),
                           "--public-key", str(metered.root / "audit.pub.pem"), *args],
                          env=env, capture_output=True, text=True, timeout=60)


def _operator_token(metered, roles=(OPERATOR_ROLE,)) -> str:
    return metered.issuer.mint(PLATFORM, audience=AUDIENCE, app=True, roles=roles)


def _admin(metered, token: str | None, **params) -> httpx.Response:
    params = {"from": _iso(metered.start), "to": _iso(metered.end)} | params
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.get(metered.admin_url, params=params, headers=headers, timeout=30)


def _by_principal(rows: list[dict]) -> dict:
    figures = defaultdict(Counter)
    for row in rows:
        assert row["model"] == "demo" and row["deployment"]
        for name in FIGURES:
            figures[row["tenant"], row["principal"]][name] += int(row[name])
    return figures


def test_the_report_matches_the_clients_usage_exactly(metered) -> None:
    done = _report(metered, "--format", "json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert _by_principal(report["rows"]) == metered.told
    for name in FIGURES:
        assert report["totals"][name] == sum(c[name] for c in metered.told.values())
    assert report["totals"]["cached_tokens"] > 0  # the repeated prompts hit each tenant's cache
    # The engine's figures: every request held KV and ran in steps.
    assert all(row["kv_block_seconds"] > 0 and row["engine_ms"] > 0 for row in report["rows"])
    assert report["audit"]["verdict"] == "ok" and report["audit"]["records"] >= report["totals"]["requests"]
    for tenant, _ in PRINCIPALS:  # digests only, never the ids
        assert tenant not in done.stdout


def test_csv_has_the_same_rows(metered) -> None:
    as_json = json.loads(_report(metered, "--format", "json").stdout)
    done = _report(metered, "--format", "csv")
    assert done.returncode == 0, done.stderr
    rows = list(csv.DictReader(io.StringIO(done.stdout)))
    assert _by_principal(rows) == metered.told
    assert [r["tenant"] for r in rows] == [r["tenant"] for r in as_json["rows"]]


def test_prices_add_a_cost_and_names_come_only_from_the_operators_file(metered, tmp_path) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"currency": "EUR", "models": {"demo": {
        "prompt_per_1m": 1000, "cached_per_1m": 100, "completion_per_1m": 2000, "kv_block_hour": 3.6}}}))
    names = tmp_path / "names.json"
    names.write_text(json.dumps({ALPHA: "Alpha Inc."}))
    done = _report(metered, "--prices", str(prices), "--names", str(names))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["currency"] == "EUR" and report["unpriced_models"] == []
    for row in report["rows"]:
        expected = ((row["prompt_tokens"] - row["cached_tokens"]) * 1000 + row["cached_tokens"] * 100
                    + row["completion_tokens"] * 2000) / 1e6 + row["kv_block_seconds"] / 3600 * 3.6
        assert row["cost"] == pytest.approx(expected, abs=2e-6)
    assert report["totals"]["cost"] == pytest.approx(sum(r["cost"] for r in report["rows"]), abs=1e-5)
    named = {r["tenant_name"] for r in report["rows"]}
    assert named == {"Alpha Inc.", None}  # Gamma and Theta are not in the file
    assert "Alpha Inc." not in metered.settings.audit_file.read_text()


def test_admin_usage_serves_the_same_figures_to_operators_only(metered) -> None:
    cli = json.loads(_report(metered).stdout)
    answer = _admin(metered, _operator_token(metered))
    assert answer.status_code == 200, answer.text
    assert answer.json()["rows"] == cli["rows"] and answer.json()["totals"] == cli["totals"]
    as_csv = _admin(metered, _operator_token(metered), format="csv")
    assert as_csv.status_code == 200 and _by_principal(list(csv.DictReader(io.StringIO(as_csv.text)))) == metered.told

    unauthenticated = _admin(metered, None)
    assert unauthenticated.status_code == 401 and unauthenticated.json()["error"]["type"] == "invalid_request_error"
    assert _admin(metered, "not-a-token").status_code == 401
    caller = metered.issuer.mint(ALPHA, audience=AUDIENCE)  # a valid token of a tenant's user, not an operator
    refused = _admin(metered, caller)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "operator_role_required"
    bad = _admin(metered, _operator_token(metered), **{"from": "yesterday"})
    assert bad.status_code == 400 and "ISO 8601" in bad.json()["error"]["message"]
    admin_records = [json.loads(line) for line in metered.settings.audit_file.read_text().splitlines()
                     if '"route":"admin.usage"' in line]
    assert [(r["status"], r["outcome"]) for r in admin_records] == [  # a refusal past authentication too
        (200, "completed"), (200, "completed"), (403, "operator_role_required"), (400, "invalid_request")]
    # The public port has no admin routes.
    assert httpx.get(metered.base_url + "/admin/usage", headers={"Authorization": f"Bearer {_operator_token(metered)}"},
                     params={"from": _iso(metered.start), "to": _iso(metered.end)}).status_code == 404


def test_a_tampered_record_fails_the_report_and_bills_nothing(metered) -> None:
    # Last in this module: it edits the live trail. One record's completion tokens, lowered.
    path: Path = metered.settings.audit_file
    lines = path.read_text().splitlines()
    index = next(i for i, line in enumerate(lines)
                 if '"usage":{"cached_tokens"' in line and '"completion_tokens":3' in line)
    lines[index] = lines[index].replace('"completion_tokens":3', '"completion_tokens":1', 1)
    path.write_text("\n".join(lines) + "\n")

    done = _report(metered, "--format", "csv")
    assert done.returncode == 1
    assert done.stdout == ""  # no partial bill
    assert "tampered" in done.stderr and "altered" in done.stderr

    answer = _admin(metered, _operator_token(metered))
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "audit_verification_failed" and "altered" in error["message"]
    assert "rows" not in answer.text
