"""How long the engine takes to start on SmolLM2 with the gateway's default KV pool (256 MiB): the
first start (the GGUF file converted into the cache) and a later one (the converted weights read
back), each in a fresh process, against
the limits the real-model issue set (first <= 10 s, later <= 3 s). Python and torch imports are
printed apart: they are the same for any model. The first start loads the quantized kernels that
`make install` built; a second first start, in an empty cache with no installed kernels, times
what a source edited since the install (or an install without a compiler that later gets one)
pays: the kernels built with g++ beside the conversion.

    .venv/bin/python bench/startup.py            # 3 later starts
    .venv/bin/python bench/startup.py --compare  # and 3 with dequantized weights, resident memory beside
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.model import kernels

ROOT = Path(__file__).resolve().parents[1]
FIRST_LIMIT_S, LATER_LIMIT_S = 10.0, 3.0

PROBE = """
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from engine import EngineConfig, LLMEngine
from engine.model import kernels
from gateway.settings import Settings
if sys.argv[2] == "build-kernels":
    kernels.INSTALLED_DIR = Path("/nonexistent/tenantgate-installed-kernels")
t1 = time.perf_counter()
engine = LLMEngine(EngineConfig(model="smollm2-135m-instruct", kv_cache_memory_bytes=Settings().kv_cache_memory_bytes,
                                weights=sys.argv[1]))
t2 = time.perf_counter()
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
rss = int(status["VmRSS"].split()[0]) * 1024
print(json.dumps({"imports": t1 - t0, "engine": t2 - t1, "rss": rss, "weights": engine.runner.weights}))
"""


def start(cache_dir: str, weights: str, kernels: str = "installed") -> dict:
    env = dict(os.environ, TENANTGATE_CACHE_DIR=cache_dir)
    done = subprocess.run([sys.executable, "-c", PROBE, weights, kernels], cwd=ROOT, env=env, capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--later", type=int, default=3, help="later starts to time")
    parser.add_argument("--weights", default="auto", help="auto, quantized or dequantized")
    parser.add_argument("--compare", action="store_true", help="also time later starts with dequantized weights")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tenantgate-startup-") as cache:
        first = start(cache, args.weights)
        later = [start(cache, args.weights) for _ in range(args.later)]
        dense = [start(cache, "dequantized") for _ in range(args.later)] if args.compare else []
    with tempfile.TemporaryDirectory(prefix="tenantgate-startup-") as cache:
        building = start(cache, args.weights, "build-kernels")
    installed = kernels.installed_library() is not None
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    engine = statistics.median(r["engine"] for r in later)
    print(f"startup (SmolLM2-135M-Instruct, default settings, weights {later[0]['weights']}; load average {load})")
    print(f"  first start: engine {first['engine']:.2f} s (limit {FIRST_LIMIT_S:.0f}: "
          f"{'met' if first['engine'] <= FIRST_LIMIT_S else 'MISSED'}), imports {first['imports']:.2f} s; "
          f"kernels {'built at install' if installed else 'NOT built at install (make install builds them)'}")
    print(f"  first start building the kernels too (none installed, empty cache): engine {building['engine']:.2f} s")
    print(f"  later start: engine {engine:.2f} s median of {len(later)} (limit {LATER_LIMIT_S:.0f}: "
          f"{'met' if engine <= LATER_LIMIT_S else 'MISSED'}), imports "
          f"{statistics.median(r['imports'] for r in later):.2f} s")
    print(f"  resident memory after start: {statistics.median(r['rss'] for r in later) / 2**20:.0f} MiB")
    if dense:
        print(f"  weights dequantized: later start {statistics.median(r['engine'] for r in dense):.2f} s, "
              f"resident memory {statistics.median(r['rss'] for r in dense) / 2**20:.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
