"""The embedded policy service across reloads: reloading does not leak a regorus engine each time."""

from __future__ import annotations

import copy
import gc
import json
import time
import uuid

from gateway.policy.service import EmbeddedPolicy
from tests.gateway.policy.conftest import SAMPLES
from tests.utils.issuer import FABRIKAM

SAMPLE = SAMPLES["allow_standard_app_token"]["input"]


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


RELOADS, WARM_UP = 60, 10


async def test_reloads_of_a_large_data_file_do_not_leak_engines(policy_copy) -> None:
    tenants_file = policy_copy / "data" / "tenants.example.json"
    data = json.loads(tenants_file.read_text())
    template = data["tenants"][FABRIKAM]
    for _ in range(2000):
        data["tenants"][str(uuid.uuid4())] = copy.deepcopy(template)
    tenants_file.write_text(json.dumps(data))
    policy = EmbeddedPolicy(policy_copy)
    await policy.decide(SAMPLE)

    started, warm = time.monotonic(), None
    for i in range(RELOADS):
        data["tenants"][FABRIKAM]["limits"]["priority"] = 1 + i % 2
        tenants_file.write_text(json.dumps(data) + " " * (i % 3))  # the size changes too, whatever the mtime does
        assert await policy.reload_if_changed()
        assert (await policy.decide(SAMPLE)).decision.limits.priority == 1 + i % 2  # the loop builds its engine
        if i + 1 == WARM_UP:
            gc.collect()
            warm = _rss_mb()
    gc.collect()
    growth = _rss_mb() - warm
    # Each leaked engine holds the whole data document (~5 MB here): 50 reloads leak ~250 MB.
    assert growth < 32, f"RSS grew {growth:.0f} MB over {RELOADS - WARM_UP} reloads"
    assert policy.reload_failures == 0
    assert time.monotonic() - started < 60
