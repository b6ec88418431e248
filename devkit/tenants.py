"""Policy data at scale, for tests and benchmarks: a crowd of registered tenants, and a tenant
whose data makes the policy's evaluation fail (an error in regorus, not a deny)."""

from __future__ import annotations

import copy
import json
import uuid
from pathlib import Path

_CROWD = uuid.UUID("6f1c0f2e-5a0d-4c83-9d65-0c4f3b7a2e10")


def crowd_ids(count: int) -> list[str]:
    """Tenant ids that no real or test tenant has, the same ones on every call."""
    return [str(uuid.uuid5(_CROWD, f"tenant-{i}")) for i in range(count)]


def with_crowd(data: dict, template: str, count: int) -> dict:
    """A copy of a policy data document with `count` more tenants, each a copy of `template`'s."""
    grown = copy.deepcopy(data)
    for tenant in crowd_ids(count):
        grown["tenants"][tenant] = copy.deepcopy(data["tenants"][template])
    return grown


def failing_evaluation(tenant: dict) -> dict:
    """A copy of a tenant's data whose revocations are a string: the authn package looks the caller
    up in them with object.get, and regorus fails that evaluation (`object.get` expects an object),
    as OPA does with strict built-in errors, for every request of the tenant, where a missing value
    would only deny."""
    broken = copy.deepcopy(tenant)
    broken["revocations"] = "every token"
    return broken


def write_tenants(data_dir: Path, data: dict) -> Path:
    """Writes a data document as the data directory's one file (tenants.json)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / "tenants.json"
    path.write_text(json.dumps(data))
    return path
