"""Limiter decisions per second and latency: the in-process limiter against the Redis one
(a real redis-server on loopback, one atomic Lua script per decision), same run.

Each decision is a full admission (four GCRA budgets and the concurrency set) followed by
its settle, as the gateway does per request, spread over 50 tenants of 20 principals.
Printed: decisions/s at concurrency 1 and 32, p50/p99 of admit+settle at concurrency 1.

    .venv/bin/python bench/limiter.py            # 20,000 decisions per limiter
    .venv/bin/python bench/limiter.py --n 2000   # a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from devkit.redis import RedisServer, find_redis_server
from gateway.limits import Admission, InProcessLimiter
from gateway.limits.redis import RedisLimiter, redis_client


def admissions(n: int) -> list[Admission]:
    return [Admission(tenant=f"t{i % 50}", principal=f"p{i % 20}", request_id=f"r{i}", tokens=200,
                      requests_per_minute=10**9, tokens_per_minute=10**12, principal_requests_per_minute=10**9,
                      principal_tokens_per_minute=10**12, concurrent_requests=10**6) for i in range(n)]


async def run(limiter, items: list[Admission], concurrency: int) -> tuple[float, list[float]]:
    latencies: list[float] = []
    queue = iter(items)

    async def worker() -> None:
        for admission in queue:
            start = time.perf_counter()
            ticket = await limiter.admit(admission)
            await limiter.settle(ticket, 150)
            latencies.append(time.perf_counter() - start)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(items) / (time.perf_counter() - start), latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1e6


async def measure(name: str, limiter, n: int) -> None:
    await run(limiter, admissions(500), 8)  # warm: script load, connections
    rate1, latencies = await run(limiter, admissions(n), 1)
    rate32, _ = await run(limiter, admissions(n), 32)
    print(f"{name:<11} c=1 {rate1:>9,.0f} decisions/s  p50 {pct(latencies, 0.5):>7.1f} us  "
          f"p99 {pct(latencies, 0.99):>7.1f} us   c=32 {rate32:>9,.0f} decisions/s")
    return rate1, rate32


async def main_async(n: int) -> None:
    binary = find_redis_server()
    if binary is None:
        raise SystemExit("redis-server not found: run scripts/install-redis.sh")
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(binary, Path(tmp)).start()
        try:
            print(f"limiter: {n} admit+settle pairs per measurement, redis-server on loopback")
            memory = await measure("in-process", InProcessLimiter(), n)
            limiter = RedisLimiter(redis_client(server.url, timeout_s=1.0))
            try:
                redis = await measure("redis", limiter, n)
            finally:
                await limiter.aclose()
            print(f"redis / in-process: c=1 {redis[0] / memory[0]:.3f}  c=32 {redis[1] / memory[1]:.3f}")
        finally:
            server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=20000)
    args = parser.parse_args()
    asyncio.run(main_async(args.n))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
