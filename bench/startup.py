"""How long the engine takes to start on SmolLM2 with the gateway's default KV pool (256 MiB): the
first start (the GGUF file converted into the cache) and a later one (the converted weights read
back), each in a fresh process, against
the limits the real-model issue set (first <= 10 s, later <= 3 s). Python and torch imports are
printed apart: they are the same for any model. The first start loads the quantized kernels that
`make install` built; a second first start, in an empty cache with no installed kernels, times
what a source edited since the install (or an install without a compiler that later gets one)
pays: the kernels built with g++ beside the conversion.

Resident memory is read after 4 tokens, once every weight has been read (a mapped weight file is
resident only once read), and split: torch's imports (the PyPI wheel is a CUDA build: its libraries
are most of it), the KV pool (the gateway's setting, the same for either weights), and the rest, the
model's own; of that, the weights (the packed file's resident pages and the dense parameters).

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
def rss():
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    return int(status["VmRSS"].split()[0]) * 1024
t1 = time.perf_counter()
imported = rss()
engine = LLMEngine(EngineConfig(model="smollm2-135m-instruct", kv_cache_memory_bytes=Settings().kv_cache_memory_bytes,
                                weights=sys.argv[1]))
t2 = time.perf_counter()
# A few tokens first, so that every weight has been read: a mapped weight file is resident only once read.
from engine import SamplingParams
from engine.envelope import local_envelope
engine.generate(["What does a gateway do?"], SamplingParams(max_tokens=4, temperature=0), local_envelope())
kv = sum(t.numel() * t.element_size() for pair in engine.runner.kv_caches for t in pair)
packed = str(engine.model_path / "quantized.safetensors")
mapped, current = 0, None
for line in open("/proc/self/smaps"):
    fields = line.split()
    if "-" in fields[0] and len(fields) >= 5:
        current = fields[5] if len(fields) > 5 else None
    elif fields[0] == "Rss:" and current == packed:
        mapped += int(fields[1]) * 1024
dense = sum(t.numel() * t.element_size() for t in engine.runner.model.parameters())
print(json.dumps({"imports": t1 - t0, "engine": t2 - t1, "rss": rss(), "imported": imported, "kv": kv,
                  "weights_resident": mapped + dense, "weights": engine.runner.weights,
                  "installed": kernels.installed_library() is not None}))
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
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    engine = statistics.median(r["engine"] for r in later)
    print(f"startup (SmolLM2-135M-Instruct, default settings, weights {later[0]['weights']}; load average {load})")
    print(f"  first start: engine {first['engine']:.2f} s (limit {FIRST_LIMIT_S:.0f}: "
          f"{'met' if first['engine'] <= FIRST_LIMIT_S else 'MISSED'}), imports {first['imports']:.2f} s; "
          f"kernels {'built at install' if first['installed'] else 'NOT built at install (make install builds them)'}")
    print(f"  first start building the kernels too (none installed, empty cache): engine {building['engine']:.2f} s")
    print(f"  later start: engine {engine:.2f} s median of {len(later)} (limit {LATER_LIMIT_S:.0f}: "
          f"{'met' if engine <= LATER_LIMIT_S else 'MISSED'}), imports "
          f"{statistics.median(r['imports'] for r in later):.2f} s")
    print(f"  resident memory after start and 4 tokens: {memory(later)}")
    if dense:
        print(f"  weights dequantized: later start {statistics.median(r['engine'] for r in dense):.2f} s, "
              f"resident memory {memory(dense)}")
        for what, key in (("weights", "weights_resident"), ("the model (weights, tokenizer, buffers)", "own"),
                          ("the process", "rss")):
            ratio = median_of(later, key) / median_of(dense, key)
            print(f"  {what}: quantized {ratio:.2f}x dequantized")
    return 0


def median_of(runs: list[dict], key: str) -> float:
    # "own": what the engine holds past torch's imports and the KV pool (the same in both modes).
    return statistics.median(r["rss"] - r["imported"] - r["kv"] if key == "own" else r[key] for r in runs)


def memory(runs: list[dict]) -> str:
    mib = lambda key: f"{median_of(runs, key) / 2**20:.0f}"  # noqa: E731
    return (f"{mib('rss')} MiB: imports {mib('imported')}, KV pool {mib('kv')}, the model {mib('own')} "
            f"(weights {mib('weights_resident')})")


if __name__ == "__main__":
    raise SystemExit(main())
