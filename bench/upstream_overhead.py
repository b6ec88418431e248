"""What the gateway adds in front of a real upstream: llama.cpp's llama-server on SmolLM2, called
through the gateway (an `openai` deployment, dialect llamacpp) and called directly, in one run.

The gateway does its whole path for each request (Entra token, Rego decision, clamp, limits, the
upstream call with its knobs, usage, audit record); the direct call sends llama-server the same
chat request. Rounds alternate gateway and direct, each printing the load average; reported are
the median over rounds of p50 latency at concurrency 1 (target: added <= 1 ms) and of requests/s
at concurrency 32, and their ratio.

    .venv/bin/python bench/upstream_overhead.py             # 5 rounds of 200 requests at c=1, 256 at c=32
    .venv/bin/python bench/upstream_overhead.py --n 50      # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import httpx

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

from gateway_overhead import (
    AUDIENCE,
    TENANT,
    bench_data,
    percentile,
    print_profile,
    run_load,
    serve_at_the_edge,
    start_server,
    stop_server,
)
from real_model import LlamaCpp, cpu_seconds, llamacpp_bin_dir

from devkit.issuer import LocalIssuer
from devkit.server import free_port

TARGET_ADDED_P50_MS = 1.0
MAX_TOKENS = 4
SLOTS = 4
# One thread: the gateway gets the other core. With both cores, any work of the gateway
# process preempts one of llama-server's two threads, and its step waits for it.
THREADS = 1
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of France?"}]


def serve_gateway(port: int, issuer_url: str, data_dir: str, deployments: str, audit_file: str) -> None:
    from gateway.app import create_app
    from gateway.settings import Settings

    settings = Settings(deployments_file=Path(deployments), authority=issuer_url, v1_issuer_host=issuer_url,
                        audiences=[AUDIENCE], policy_data_dir=Path(data_dir), metrics_port=0,
                        policy_reload_interval_s=0, audit_stdout=False, audit_file=Path(audit_file),
                        audit_signing_key=Path(audit_file).with_name("audit-signing.pem"))
    serve_at_the_edge(create_app(settings), port, settings.edge_limits)  # as `tenantgate serve` runs it


def bodies(n: int, *, direct: bool) -> list[bytes]:
    body = {"model": "smollm2" if direct else "demo", "messages": MESSAGES, "max_tokens": MAX_TOKENS,
            "temperature": 0}
    if direct:
        body["cache_prompt"] = True  # what the gateway sends this deployment
    return [json.dumps(body).encode()] * n


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=200, help="requests per round at concurrency 1")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="run the gateway under cProfile and print it")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--issuer-url", help=argparse.SUPPRESS)
    parser.add_argument("--data-dir", help=argparse.SUPPRESS)
    parser.add_argument("--deployments", help=argparse.SUPPRESS)
    parser.add_argument("--audit-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve == "gateway":
        serve_gateway(args.port, args.issuer_url, args.data_dir, args.deployments, args.audit_file)
        return 0

    from engine import packaged_model_file

    bin_dir = llamacpp_bin_dir()  # the build's cache, before the gateway gets a cache of its own
    os.environ.setdefault("TENANTGATE_CACHE_DIR", tempfile.mkdtemp(prefix="tenantgate-bench-"))
    llama = LlamaCpp(bin_dir, packaged_model_file("smollm2-135m-instruct"), threads=THREADS, slots=SLOTS, slot_ctx=512)
    with tempfile.TemporaryDirectory() as tmp, LocalIssuer(port=0) as issuer:
        tmp_path = Path(tmp)
        deployments = tmp_path / "deployments.json"
        deployments.write_text(json.dumps({"models": {"demo": [{
            "name": "llama", "kind": "openai", "dialect": "llamacpp", "url": llama.url + "/v1",
            "upstream_model": "smollm2",
            # Dedicated to the one tenant, so its prompts may stay cached (its decisions have tenant
            # scope): each call is then a few decode steps, and the rounds vary far less than with
            # a full prefill per call, which hid a few ms either way.
            "cache_prompt": True, "dedicated_tenants": [TENANT]}]}}))
        token = issuer.mint(TENANT, audience=AUDIENCE, lifetime_s=6 * 3600)
        port = free_port()
        gateway = start_server(["gateway", "--issuer-url", issuer.base_url, "--data-dir", str(bench_data(tmp_path)),
                                "--deployments", str(deployments), "--audit-file", str(tmp_path / "audit.log")],
                               port, tmp_path / "gateway.prof" if args.profile else None, script=__file__)
        servers = {"gateway": (f"http://127.0.0.1:{port}", False), "direct": (llama.url, True)}
        try:
            check = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", content=bodies(1, direct=False)[0],
                               headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
                               timeout=60)
            check.raise_for_status()
            print(f"upstream_overhead: llama-server ({SLOTS} slots, {THREADS} thread) on SmolLM2, "
                  f"{MAX_TOKENS} new tokens, "
                  f"{args.rounds} alternating rounds of {args.n} requests at concurrency 1 and {SLOTS * 32} at 32, "
                  "prompt cached (deployment dedicated to the tenant)")
            p50 = {name: [] for name in servers}
            rps = {name: [] for name in servers}
            gateway_cpu = []  # the gateway process's CPU ms per request at concurrency 1
            for round_ in range(1, args.rounds + 1):
                for name, (url, direct) in servers.items():
                    asyncio.run(run_load(url, token, bodies(10, direct=direct), 1))  # warm the connections
                    cpu = cpu_seconds(gateway.pid)
                    latencies, _ = asyncio.run(run_load(url, token, bodies(args.n, direct=direct), 1))
                    if not direct:
                        gateway_cpu.append((cpu_seconds(gateway.pid) - cpu) / args.n * 1e3)
                    many = bodies(SLOTS * 32, direct=direct)
                    _, elapsed = asyncio.run(run_load(url, token, many, 32))
                    p50[name].append(percentile(latencies, 0.5) * 1e3)
                    rps[name].append(len(many) / elapsed)
                    print(f"  round {round_} {name:8s} c=1 p50 {p50[name][-1]:7.3f} ms  c=32 {rps[name][-1]:6.1f} req/s"
                          f"  load {load_average()}")
            added = [g - d for g, d in zip(p50["gateway"], p50["direct"])]
            ratio = [g / d for g, d in zip(rps["gateway"], rps["direct"])]
            median_added = statistics.median(added)
            print(f"\nconcurrency 1: p50 gateway {statistics.median(p50['gateway']):.3f} ms, direct "
                  f"{statistics.median(p50['direct']):.3f} ms; added (median of rounds) {median_added:.3f} ms "
                  f"(target <= {TARGET_ADDED_P50_MS}: {'met' if median_added <= TARGET_ADDED_P50_MS else 'MISSED'})")
            print(f"gateway process CPU per request at concurrency 1: {statistics.median(gateway_cpu):.2f} ms "
                  "(median of rounds; time the gateway works while the upstream decodes overlaps it)")
            print(f"concurrency 32: gateway {statistics.median(rps['gateway']):.1f} req/s, direct "
                  f"{statistics.median(rps['direct']):.1f} req/s; "
                  f"ratio (median of rounds) {statistics.median(ratio):.2f}")
        finally:
            stop_server(gateway)
            llama.close()
        if args.profile and (tmp_path / "gateway.prof").exists():
            print_profile(tmp_path / "gateway.prof")
            if os.environ.get("KEEP_PROFILE"):
                import shutil
                shutil.copy(tmp_path / "gateway.prof", os.environ["KEEP_PROFILE"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
