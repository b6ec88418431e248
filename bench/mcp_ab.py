"""The MCP gateway's tools/call path at another revision against the working tree, side by side (as
bench/gateway_ab.py does for the inference path): the way to tell whether a change helps the MCP
path on a machine whose speed drifts by a third within an hour.

REV is checked out in a git worktree of its own (a temporary folder, removed at the end). Each side
serves the gateway as bench/mcp_overhead.py serves it, from its own tree, and both front one MCP
server (devkit's example server). Rounds alternate the two sides (the order swapped every round);
each round drives each side with wrk at concurrency 1 for a few seconds (as bench/mcp_overhead.py
does, each call with its own id and argument) and reads the gateway's CPU time from /proc over it.
Per round and side it prints the gateway's CPU per call (steadier than latency on a shared machine)
and the c1 p50; at the end the medians, the per-round differences and the working tree's figures as
ratios of REV's.

    .venv/bin/python bench/mcp_ab.py HEAD                  # the uncommitted change against HEAD
    .venv/bin/python bench/mcp_ab.py HEAD~3 --rounds 12    # the last three commits together
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gateway_ab import remove_worktree, worktree
from bench.gateway_overhead import cpu_seconds, load_average, start_server, stop_server
from bench.mcp_overhead import AUDIENCE, TENANT, bench_data, wrk_script, wrk_session
from bench.vs_litellm import wrk
from devkit.issuer import LocalIssuer
from devkit.server import free_port


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev", help="the revision to compare the working tree with (HEAD, a commit, a branch)")
    parser.add_argument("--rounds", type=int, default=8, help="alternating rounds")
    parser.add_argument("--seconds", type=float, default=3.0, help="wrk's run per side and round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LocalIssuer(port=0) as issuer, ExitStack() as stack:
        tmp_path = Path(tmp)
        tree = worktree(args.rev, tmp_path)
        stack.callback(remove_worktree, tree)
        data_dir = tmp_path / "data"
        data_dir.mkdir()
        bench_data(data_dir)
        mcp_port = free_port()
        upstream = f"http://127.0.0.1:{mcp_port}/mcp"
        stack.callback(stop_server, start_server(["mcp"], mcp_port, script=str(ROOT / "bench" / "mcp_overhead.py"),
                                                 ready_path="/"))
        sides: dict[str, tuple[str, int]] = {}
        for name, root in ((args.rev, tree), ("working tree", ROOT)):
            port = free_port()
            workdir = tmp_path / ("served-rev" if root is tree else "served-work")  # audit trail, servers file
            workdir.mkdir()
            process = start_server(["gateway", "--issuer-url", issuer.base_url, "--data-dir", str(data_dir),
                                    "--workdir", str(workdir), "--upstream", upstream], port,
                                   script=str(root / "bench" / "mcp_overhead.py"), ready_path="/healthz")
            stack.callback(stop_server, process)
            sides[name] = (f"http://127.0.0.1:{port}/mcp/devtools", process.pid)
        token = issuer.mint(TENANT, audience=AUDIENCE, scopes=("Tools.Invoke",), lifetime_s=6 * 3600)
        headers = {"authorization": f"Bearer {token}"}
        scripts = {}
        for name, (url, _) in sides.items():
            scripts[name] = wrk_script(tmp_path, f"side{len(scripts)}", asyncio.run(wrk_session(url, headers)))
            wrk(url, scripts[name], 1, 2, path="")  # warm: the catalogue, the caches
        print(f"mcp_ab: {args.rev} against the working tree, tools/call through /mcp/devtools; wrk at concurrency 1 "
              f"for {args.seconds:g} s per side and round, {args.rounds} alternating rounds; "
              f"load {load_average()}", flush=True)
        results: dict[str, dict[str, list[float]]] = {name: {"cpu_us": [], "p50": []} for name in sides}
        for round_ in range(args.rounds):
            for name in list(sides) if round_ % 2 == 0 else list(reversed(sides)):
                url, pid = sides[name]
                before = cpu_seconds(pid)
                run = wrk(url, scripts[name], 1, args.seconds, path="")
                cpu_us = (cpu_seconds(pid) - before) / run["requests"] * 1e6
                results[name]["cpu_us"].append(cpu_us)
                results[name]["p50"].append(run["p50"])
                print(f"  round {round_ + 1} {name:<14} CPU {cpu_us:6.1f} us/call  c1 p50 "
                      f"{results[name]['p50'][-1]:6.3f} ms  load {load_average()}", flush=True)
    base, work = results[args.rev], results["working tree"]
    medians = {name: {key: statistics.median(values) for key, values in r.items()} for name, r in results.items()}
    for name, m in medians.items():
        print(f"  median {name:<14} CPU {m['cpu_us']:6.1f} us/call  c1 p50 {m['p50']:6.3f} ms")
    cpu_lower = sum(w <= b for b, w in zip(base["cpu_us"], work["cpu_us"]))
    p50_lower = sum(w < b for b, w in zip(base["p50"], work["p50"]))
    cpu_diffs = [round(w - b, 1) for b, w in zip(base["cpu_us"], work["cpu_us"])]
    p50_diffs = [round((w - b) * 1000) for b, w in zip(base["p50"], work["p50"])]
    print(f"  per round, working tree - {args.rev}: CPU {cpu_diffs} us, p50 {p50_diffs} us")
    cpu_ratio = medians["working tree"]["cpu_us"] / medians[args.rev]["cpu_us"]
    p50_ratio = medians["working tree"]["p50"] / medians[args.rev]["p50"]
    print(f"  working tree / {args.rev}: CPU per call {cpu_ratio:.3f}x (lower or equal in {cpu_lower} of "
          f"{args.rounds} rounds), c1 p50 {p50_ratio:.3f}x (lower in {p50_lower})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
