"""A regional failover behind Front Door's probe settings (bench/failover.py measures it at their
real interval; this runs it with the interval scaled down, the window and threshold as deployed).

Two stamps (`tenantgate serve` on the demo model, each with its own redis-server and audit file)
behind a local HAProxy configured from infra/'s origin group; the first stamp is SIGKILLed under
a steady load on the openai SDK. What must hold: failures stop once the stamp is out of rotation,
within the probe's detection bound, and no request a caller got a 200 for lacks its audit record
in the stamp that served it.
"""

from __future__ import annotations

from pathlib import Path

from devkit.failover import AUDIENCE, TENANT, OriginProbe, front_door_probe, run_failover
from devkit.issuer import LocalIssuer

PROBE_SCALE = 0.05  # Front Door's 30 s interval becomes 1.5 s
SLACK_S = 1.0  # scheduling on a loaded machine


def test_fall_and_rise_reproduce_front_doors_sample_window_for_a_hard_loss() -> None:
    for sample_size in range(1, 9):
        for required in range(1, sample_size + 1):
            probe = OriginProbe(30, sample_size, required, "/readyz", "GET")
            window = [True] * sample_size  # healthy: every recent probe good
            failures = 0
            while sum(window[-sample_size:]) >= required:
                window.append(False)
                failures += 1
            window = [False] * sample_size  # out: every recent probe failed
            successes = 0
            while sum(window[-sample_size:]) < required:
                window.append(True)
                successes += 1
            assert (probe.fall, probe.rise) == (failures, successes), (sample_size, required)


def test_the_probe_is_read_from_infra_as_deployed() -> None:
    probe = front_door_probe()
    assert probe.path == "/readyz" and probe.method in {"GET", "HEAD"}
    assert probe.fall >= 1 and probe.rise >= 1 and probe.interval_s > 0


def test_killing_a_stamp_loses_no_acknowledged_record_and_failures_stop_within_the_probe_bound(
        haproxy_binary: str, redis_binary: str, demo_model_dir: Path, tmp_path: Path) -> None:
    # demo_model_dir: the demo model is built once per session, before the stamps start.
    probe = front_door_probe().scaled(PROBE_SCALE)
    bound = probe.detection_bound_s + SLACK_S
    with LocalIssuer(port=0) as issuer:
        token = issuer.mint(TENANT, audience=AUDIENCE, lifetime_s=600)
        run = run_failover(tmp_path, issuer.base_url, token, probe, redis_binary=redis_binary,
                           haproxy_binary=haproxy_binary, rate=10, before_s=2, after_s=bound + 2)
    f = run.plain
    # The kill hit live traffic: the stamp served before it, and some requests failed.
    assert run.stamp_requests.get(run.killed, 0) > 0 and f.lost > 0, run
    # Out of rotation within the bound, and from then on no request lost (a refusal by the
    # survivor, a 429 on an overloaded machine, is the survivor's answer, not the failover's).
    assert f.out_of_rotation_s is not None and f.out_of_rotation_s <= bound, run
    assert f.lost_stopped_s is not None and f.lost_stopped_s <= bound, run
    assert run.stamp_requests.get("neu", 0) > 0
    # Every 200 has its record in the stamp that served it, the killed one included.
    assert f.unattributed == 0 and f.lost_records == [], f.lost_records
    assert all(report.ok for report in run.verified.values()), run.verified
