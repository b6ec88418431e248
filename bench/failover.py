"""A regional failover, measured: the RTO the landing zone's Front Door settings give a caller.

Two stamps, as docs/deploy.md deploys them in two regions, each a real `tenantgate serve` on the
demo model with its own redis-server and its own audit file, behind a local HAProxy configured
with the Front Door origin group's health probe (path, method, interval) and its sample window
and threshold, as read from infra/terraform/main.frontdoor.tf and infra/bicep/modules/front-door.bicep
(devkit/failover.py: how sample_size / successful_samples_required map to HAProxy's
fall / rise). A local Entra-style issuer signs the callers' tokens.

Under a steady load of short chat completions on the official openai SDK (--rate a second,
max_retries=0, sent on schedule whatever the answers; beside it --retrying-rate a second with the
SDK's default two retries), the first stamp's gateway is SIGKILLed --before seconds in, as a
region loss, and the load runs on past the detection bound. Printed:
- the time from the kill until no request fails (the last failed request's send time), and when
  HAProxy took the stamp out of rotation;
- how many requests failed, by status, with and without the SDK's retries;
- whether any acknowledged (200) request's audit record was lost: every request id a caller got a
  200 for must have a record in the audit file of the stamp that served it (HAProxy names it in a
  response header), the killed stamp's file included;
- the probe settings the run used (--probe-scale shrinks the interval for a quick run) and what
  Front Door's own settings imply; the load average at start and end.

    .venv/bin/python bench/failover.py                      # Front Door's settings: 30 s probes, ~4 min
    .venv/bin/python bench/failover.py --probe-scale 0.05   # 1.5 s probes, a quick run (~30 s)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devkit.failover import AUDIENCE, TENANT, Figures, find_haproxy, front_door_probe, run_failover
from devkit.issuer import LocalIssuer
from devkit.redis import find_redis_server
from engine.paths import CACHE_DIR_ENV, default_cache_dir


def seconds(value: float | None) -> str:
    return f"{value:.1f} s" if value is not None else "n/a"


def print_figures(label: str, f: Figures) -> None:
    statuses = ", ".join(f"{status}: {n}" for status, n in sorted(f.statuses.items()))
    print(f"  {label}: {f.requests} requests ({statuses})")
    print(f"    failed {f.failed} ({100 * f.failed_share:.1f} %): {f.lost} that no stamp answered (first sent "
          f"{seconds(f.first_lost_s)} after the kill, last {seconds(f.lost_stopped_s)}), {f.refused} refused by a "
          f"live stamp (last sent {seconds(f.last_refused_s)} after the kill)")
    for status, message in f.refusal_messages.items():
        print(f"    {status}: {message!r}")
    print(f"    acknowledged {f.acknowledged}; audit records lost: {len(f.lost_records)}"
          + (f" {f.lost_records[:5]}" if f.lost_records else "")
          + (f"; {f.unattributed} answers without {'X-Served-By'}" if f.unattributed else "")
          + (f"; {f.torn_lines} torn audit lines" if f.torn_lines else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=20.0, help="requests a second without retries")
    parser.add_argument("--retrying-rate", type=float, default=5.0,
                        help="requests a second with the SDK's default retries (0: none)")
    parser.add_argument("--before", type=float, default=15.0, help="seconds of load before the kill")
    parser.add_argument("--after", type=float, default=None,
                        help="seconds of load after it (default: the detection bound + max(10 s, 3 intervals))")
    parser.add_argument("--probe-scale", type=float, default=1.0,
                        help="multiplies Front Door's probe interval (1: its real settings)")
    args = parser.parse_args()
    if not 0 < args.probe_scale <= 1 or args.rate <= 0 or args.retrying_rate < 0 or args.before <= 0:
        parser.error("--probe-scale must be in (0, 1], --rate and --before positive, --retrying-rate >= 0")
    redis_binary, haproxy_binary = find_redis_server(), find_haproxy()
    if redis_binary is None or haproxy_binary is None:
        print("failover: needs redis-server and haproxy (scripts/install-redis.sh, scripts/install-haproxy.sh)")
        return 1
    os.environ.setdefault(CACHE_DIR_ENV, str(default_cache_dir()))  # the demo model is built once, there

    front_door = front_door_probe()
    probe = front_door.scaled(args.probe_scale)
    print(f"failover: Front Door's origin group (infra/): {front_door.method} {front_door.path} every "
          f"{front_door.interval_s:g} s, healthy while >= {front_door.successful_samples_required} of the last "
          f"{front_door.sample_size} probes succeed")
    print(f"  this run: HAProxy inter {probe.interval_s:g} s (scale {args.probe_scale:g}), fall {probe.fall}, "
          f"rise {probe.rise}; detection bound {probe.detection_bound_s:g} s (fall x inter)")
    print(f"  load: {args.rate:g} req/s max_retries=0 and {args.retrying_rate:g} req/s max_retries=2, chat "
          f"completions of 4 tokens; kill (SIGKILL) of stamp weu {args.before:g} s in")
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="tenantgate-failover-") as tmp, LocalIssuer(port=0) as issuer:
        token = issuer.mint(TENANT, audience=AUDIENCE, lifetime_s=3600)
        run = run_failover(Path(tmp), issuer.base_url, token, probe, redis_binary=redis_binary,
                           haproxy_binary=haproxy_binary, rate=args.rate, retrying_rate=args.retrying_rate,
                           before_s=args.before, after_s=args.after)
    load_end = os.getloadavg()

    f = run.plain
    print(f"\nafter the kill of {run.killed}: first failed probe {seconds(run.detected_s)}, out of rotation "
          f"{seconds(f.out_of_rotation_s)}; requests stopped failing {seconds(f.lost_stopped_s)} after the kill")
    print(f"  answered by stamp: {run.stamp_requests}")
    for name, report in run.verified.items():
        print(f"  audit trail of {name}: {report.verdict}, {report.records} records, {report.checkpoints} checkpoints"
              + "".join(f"; {w}" for w in report.warnings))
    print_figures("max_retries=0", f)
    if run.retrying is not None:
        print_figures("max_retries=2", run.retrying)
    bound = front_door.detection_bound_s
    print(f"\nFront Door's own settings imply: out of rotation {bound - front_door.interval_s:g}-{bound:g} s after "
          f"a region is lost ({front_door.fall} failed probes {front_door.interval_s:g} s apart, the first up to "
          f"one interval after the loss), per edge location, each probing on its own")
    print(f"load average: start {load_start[0]:.2f} {load_start[1]:.2f} {load_start[2]:.2f}, "
          f"end {load_end[0]:.2f} {load_end[1]:.2f} {load_end[2]:.2f} ({os.cpu_count()} CPUs)")
    failed = f.lost_records or (run.retrying and run.retrying.lost_records)
    stopped = f.lost_stopped_s is None or f.lost_stopped_s <= probe.detection_bound_s + probe.interval_s
    print(f"verdict: {'no acknowledged request lost its audit record' if not failed else 'AUDIT RECORDS LOST'}; "
          f"lost requests {'stopped within' if stopped else 'went on PAST'} the detection bound + one interval"
          + (f"; the survivor refused {f.refused} (see the statuses)" if f.refused else ""))
    return 0 if not failed and stopped else 1


if __name__ == "__main__":
    raise SystemExit(main())
