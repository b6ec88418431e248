"""The gateway's request path at another revision against the working tree, side by side: the way to
tell whether a change to the hot path helps, on a machine whose speed drifts by a third within an hour.

REV is checked out in a git worktree of its own (a temporary folder, removed at the end). Each side
serves the gateway as bench/gateway_overhead.py serves it (null engine, decision cache hits, audit to
a file), each from its own tree, and the two are measured in alternating rounds. Per round and side:

- c1 p50: 1,500 sequential requests from the bench's own keep-alive client, the steadiest figure;
- at concurrency 32 under wrk: req/s, and the server's CPU per request (its user + system time from
  /proc over the run, divided by the requests), steadier than req/s when the load generator shares
  the machine.

Printed: each round with the load average, the medians, and the working tree's figures as ratios
of REV's. On this 2-core machine c1 p50 resolves about 20 us and CPU per request about 20 us; req/s
swings about 15% from round to round.

    .venv/bin/python bench/gateway_ab.py HEAD               # the uncommitted change against HEAD
    .venv/bin/python bench/gateway_ab.py HEAD~3 --rounds 7  # the last three commits together
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gateway_overhead import (
    AUDIENCE,
    TENANT,
    bench_data,
    cpu_seconds,
    load_average,
    percentile,
    request_bodies,
    run_load,
    start_server,
    stop_server,
)
from bench.vs_litellm import wrk, wrk_script
from devkit.issuer import LocalIssuer
from devkit.server import free_port

SEQUENTIAL = 1500


def worktree(rev: str, directory: Path) -> Path:
    """REV checked out (detached) under directory."""
    tree = directory / "rev"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "--force", str(tree), rev],
                   check=True, capture_output=True, text=True)
    return tree


def remove_worktree(tree: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], capture_output=True)


def measure(url: str, pid: int, token: str, script: Path, seconds: float) -> dict[str, float]:
    latencies, _ = asyncio.run(run_load(url, token, request_bodies("same", SEQUENTIAL), 1))
    before = cpu_seconds(pid)
    result = wrk(url, script, 32, seconds)
    used = cpu_seconds(pid) - before
    return {"p50": percentile(latencies, 0.5) * 1e3, "rps": result["rps"],
            "cpu_us": used / (result["rps"] * seconds) * 1e6}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev", help="the revision to compare the working tree with (HEAD, a commit, a branch)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each wrk run")
    args = parser.parse_args()
    if shutil.which("wrk") is None:
        print("gateway_ab: needs wrk (apt-get install wrk)", file=sys.stderr)
        return 1
    os.environ.setdefault("TENANTGATE_CACHE_DIR", tempfile.mkdtemp(prefix="tenantgate-bench-"))
    with tempfile.TemporaryDirectory() as tmp, LocalIssuer(port=0) as issuer, ExitStack() as stack:
        tmp_path = Path(tmp)
        tree = worktree(args.rev, tmp_path)
        stack.callback(remove_worktree, tree)
        (tmp_path / "data").mkdir()  # the policy data alone: the loader reads every JSON file under it
        data_dir = bench_data(tmp_path / "data")
        token = issuer.mint(TENANT, audience=AUDIENCE, lifetime_s=6 * 3600)
        script = wrk_script(tmp_path, "ab", token, False)
        sides = {args.rev: tree, "working tree": ROOT}
        servers = {}
        for name, root in sides.items():
            port = free_port()
            label = "rev" if root is tree else "work"
            process = start_server(["gateway", "--issuer-url", issuer.base_url, "--data-dir", str(data_dir),
                                    "--audit-file", str(tmp_path / f"audit-{label}.log"), "--settings",
                                    json.dumps({})], port, script=str(root / "bench" / "gateway_overhead.py"))
            stack.callback(stop_server, process)
            servers[name] = (f"http://127.0.0.1:{port}", process.pid)
            wrk(servers[name][0], script, 32, 2)  # warm up: connections, the decision cache
        print(f"gateway_ab: {args.rev} against the working tree, null engine, decision cache hits; c1 p50 over "
              f"{SEQUENTIAL} requests, wrk at concurrency 32 for {args.seconds:g} s; {args.rounds} alternating "
              f"rounds; load {load_average()}")
        results: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
        for round_ in range(args.rounds):
            for name, (url, pid) in servers.items():
                figures = measure(url, pid, token, script, args.seconds)
                results[name].append(figures)
                print(f"  round {round_ + 1} {name:<14} c1 p50 {figures['p50']:6.3f} ms  c32 {figures['rps']:6.0f} "
                      f"req/s  CPU {figures['cpu_us']:6.1f} us/request  load {load_average()}", flush=True)
        medians = {name: {key: statistics.median(r[key] for r in rounds) for key in ("p50", "rps", "cpu_us")}
                   for name, rounds in results.items()}
        for name, m in medians.items():
            print(f"  median {name:<14} c1 p50 {m['p50']:6.3f} ms  c32 {m['rps']:6.0f} req/s  "
                  f"CPU {m['cpu_us']:6.1f} us/request")
        base, work = medians[args.rev], medians["working tree"]
        lower = sum(w["p50"] < b["p50"] for b, w in zip(results[args.rev], results["working tree"]))
        print(f"  working tree / {args.rev}: c1 p50 {work['p50'] / base['p50']:.3f}x (lower in {lower} of "
              f"{args.rounds} rounds), c32 req/s {work['rps'] / base['rps']:.3f}x, "
              f"CPU per request {work['cpu_us'] / base['cpu_us']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
