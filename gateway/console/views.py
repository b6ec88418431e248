"""What the operator console shows, as plain data: read from the gateway's own metrics registry
(what /metrics serves), the embedded engine's step records, the quota store's last answers and
the audit trail, verified as it is read. Digests and numbers only: no view reads content.

SERIES is the one place that knows metric names and labels; a renamed metric is followed here.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from dataclasses import asdict
from datetime import UTC, datetime

from gateway.audit import digest_label, trail_files, verify_files
from gateway.context import Gateway

SERIES = {
    "requests": "tenantgate_requests_total",  # route, status, decision, tenant
    "prefix_hit_tokens": "tenantgate_prefix_cache_hit_tokens_total",  # scope
    "prefix_query_tokens": "tenantgate_prefix_cache_query_tokens_total",  # scope
    "kv_blocks": "tenantgate_kv_blocks",  # state
    "steps": "tenantgate_steps_total",  # regime, lane
    "policy_revision": "tenantgate_policy_info",  # revision
    "policy_reload_failures": "tenantgate_policy_reload_failures_total",
    "quota_rejections": "tenantgate_quota_rejections_total",  # reason
    "audit_sink_errors": "tenantgate_audit_sink_errors",
}
NO_TENANT = "none"  # the requests series' tenant before authentication (health checks, refused tokens)
REGIMES = ("normal", "memory_pressured", "queue_degraded", "isolation_strict")
TIMELINE_RUNS = 60  # the regime timeline's most recent runs of equal regime
VIEWS = ("tenants", "quotas", "kv", "prefix", "regimes", "audit", "policy")


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class Samples:
    """The registry's samples as a scrape would read them, by series key."""

    def __init__(self, registry) -> None:
        wanted = {name: key for key, name in SERIES.items()}
        self._by_key: dict[str, list[tuple[dict, float]]] = defaultdict(list)
        for family in registry.collect():
            for sample in family.samples:
                if sample.name in wanted:
                    self._by_key[wanted[sample.name]].append((sample.labels, sample.value))

    def __call__(self, key: str) -> list[tuple[dict, float]]:
        return self._by_key.get(key, [])

    def total(self, key: str) -> float:
        return sum(value for _, value in self(key))


def tenants_view(samples: Samples) -> dict:
    """Requests per tenant digest by outcome: allowed (served), denied (by policy), throttled (429),
    other (errors, bad requests, client aborts)."""
    rows: dict[str, dict] = {}
    for labels, value in samples("requests"):
        tenant = labels.get("tenant", NO_TENANT)
        if tenant == NO_TENANT or not value:
            continue
        row = rows.setdefault(tenant, {"tenant": tenant, "allowed": 0, "denied": 0, "throttled": 0, "other": 0})
        status = labels.get("status", "")
        if status == "429":
            outcome = "throttled"
        elif labels.get("decision") == "deny":
            outcome = "denied"
        elif labels.get("decision") == "allow" and status.startswith("2"):
            outcome = "allowed"
        else:
            outcome = "other"
        row[outcome] += int(value)
    for row in rows.values():
        row["total"] = row["allowed"] + row["denied"] + row["throttled"] + row["other"]
    rejections = {labels.get("reason", ""): int(value) for labels, value in samples("quota_rejections")}
    return {"rows": sorted(rows.values(), key=lambda r: r["tenant"]), "quota_rejections": rejections}


def quotas_view(gateway: Gateway, now: float) -> dict:
    rows = []
    for tenant, h in sorted(gateway.headroom.snapshot().items()):
        rows.append({"tenant": digest_label(tenant), **asdict(h), "answered": _utc(h.time),
                     "age_s": round(now - h.time)})
    return {"rows": rows, "limiter": "redis" if gateway.settings.redis_url.get_secret_value() else "in-process"}


def _engine_steps(gateway: Gateway):
    steps = gateway.backend.steps if gateway.backend is not None else None
    return None if steps is None else steps.snapshot()


def kv_view(gateway: Gateway, samples: Samples) -> dict:
    """The KV pool, and each tenant's blocks: its step records' tag is the trail's tenant digest, shown
    by its first 12 characters as in /metrics."""
    pool = {labels.get("state", ""): int(value) for labels, value in samples("kv_blocks")}
    snapshot = _engine_steps(gateway)
    if snapshot is None:
        return {"engine": False, "pool": pool, "rows": [], "step": None}
    steps, evicted = snapshot
    last = steps[-1][1] if steps else None
    rows = {}
    for tag, held, cached, share in (last.kv_tenants if last else ()):
        rows[tag] = {"tenant": digest_label(tag), "held": held, "cached": cached, "share": share, "evicted": 0}
    for tag, blocks in evicted.items():
        rows.setdefault(tag, {"tenant": digest_label(tag), "held": 0, "cached": 0, "share": 0, "evicted": 0})
        rows[tag]["evicted"] = blocks
    return {"engine": True, "pool": pool, "rows": sorted(rows.values(), key=lambda r: r["tenant"]),
            "step": last.step if last else None}


def prefix_view(samples: Samples) -> dict:
    hits = {labels.get("scope", ""): int(value) for labels, value in samples("prefix_hit_tokens")}
    queries = {labels.get("scope", ""): int(value) for labels, value in samples("prefix_query_tokens")}
    rows = [{"scope": scope, "hit_tokens": hits.get(scope, 0), "query_tokens": queried,
             "hit_rate": round(hits.get(scope, 0) / queried, 4) if queried else 0.0}
            for scope, queried in sorted(queries.items())]
    return {"rows": rows}


def regimes_view(gateway: Gateway, samples: Samples) -> dict:
    """Runs of consecutive steps under one regime, newest first, and all steps by regime (metrics)."""
    totals: defaultdict[str, int] = defaultdict(int)
    for labels, value in samples("steps"):
        totals[labels.get("regime", "")] += int(value)
    snapshot = _engine_steps(gateway)
    runs: list[dict] = []
    for at, step in (snapshot[0] if snapshot else ()):
        if runs and runs[-1]["regime"] == step.regime and runs[-1]["last_step"] + 1 == step.step:
            run = runs[-1]
            run.update(last_step=step.step, steps=run["steps"] + 1, end=_utc(at),
                       max_waiting=max(run["max_waiting"], step.num_waiting),
                       preempted=run["preempted"] + step.num_preempted)
        else:
            runs.append({"regime": step.regime, "first_step": step.step, "last_step": step.step, "steps": 1,
                         "start": _utc(at), "end": _utc(at), "max_waiting": step.num_waiting,
                         "preempted": step.num_preempted})
    runs = runs[-TIMELINE_RUNS:]
    shown = sum(run["steps"] for run in runs)
    return {"engine": snapshot is not None, "totals": {r: totals.get(r, 0) for r in REGIMES},
            "runs": runs[::-1], "steps_shown": shown}


def _verify_trail(gateway: Gateway) -> dict:
    """The whole trail verified (as `tenantgate audit verify` does without anchors), and the
    revision of the last judged request it holds."""
    settings, trail = gateway.settings, gateway.audit.trail
    if settings.audit_file is None or trail is None:
        return {"verdict": None, "reason": "no audit file (TENANTGATE_AUDIT_FILE) on this replica: "
                "verify the Redis Stream with tenantgate audit verify --redis", "last_revision": None}
    last_revision = None

    def on_line(line: bytes) -> None:
        nonlocal last_revision
        if b'"policy_revision"' in line:
            try:
                revision = json.loads(line).get("policy_revision")
            except ValueError:
                return  # not an entry: the verifier judges it
            last_revision = revision or last_revision

    try:
        report = verify_files(trail_files(settings.audit_file), [trail.public_key], on_line=on_line)
    except OSError as exc:
        return {"verdict": None, "reason": f"cannot read the audit file: {exc.strerror}", "last_revision": None}
    return {"verdict": report.verdict, "ok": report.ok, "reason": report.reason, "records": report.records,
            "checkpoints": report.checkpoints, "chains": report.chains, "chain": report.chain,
            "first_bad_seq": report.first_bad_seq, "warnings": report.warnings, "last_revision": last_revision}


def audit_view(verified: dict, samples: Samples) -> dict:
    return {**{k: v for k, v in verified.items() if k != "last_revision"},
            "sink_errors": int(samples.total("audit_sink_errors"))}


def policy_view(gateway: Gateway, verified: dict, samples: Samples) -> dict:
    revisions = [labels.get("revision", "") for labels, value in samples("policy_revision") if value]
    return {"backend": gateway.settings.policy_backend, "revision": revisions[0] if revisions else None,
            "last_judged_revision": verified.get("last_revision"),
            "reload_failures": int(samples.total("policy_reload_failures"))}


async def console_views(gateway: Gateway, names: tuple[str, ...] = VIEWS) -> dict:
    """The views asked for, from one reading of the registry (and one verification of the trail)."""
    samples = Samples(gateway.metrics.registry)
    verified = await asyncio.to_thread(_verify_trail, gateway) if {"audit", "policy"} & set(names) else {}
    now = datetime.now(UTC).timestamp()
    build = {
        "tenants": lambda: tenants_view(samples),
        "quotas": lambda: quotas_view(gateway, now),
        "kv": lambda: kv_view(gateway, samples),
        "prefix": lambda: prefix_view(samples),
        "regimes": lambda: regimes_view(gateway, samples),
        "audit": lambda: audit_view(verified, samples),
        "policy": lambda: policy_view(gateway, verified, samples),
    }
    return {"generated": _utc(now), **{name: build[name]() for name in names}}
