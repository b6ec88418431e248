"""The deterministic lane: the same tokens and bit-identical logits under any load.

For each of 50 random requests: alone and beside 1-31 random companions (other tenants,
lengths, sampled or greedy, deterministic or not), each with a cold cache and with its
prefix already cached, with and without chunked prefill. torch.equal on every step's
logits, identical tokens, every time. On a Llama with two query heads per KV head, and
(20 requests) on a Mistral with four per KV head and a 24-token sliding window.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from engine.model_runner import cpu_has_native_bf16
from engine.sampling_params import SamplingParams
from tests.utils.envelopes import envelope, segment

NUM_REQUESTS = 50


def random_processing(rng: random.Random) -> dict:
    """Penalties, logit_bias, top-k and min-p for a request, drawn at random (or none)."""
    if rng.random() < 0.3:
        return {}
    return {"presence_penalty": rng.uniform(-2, 2), "frequency_penalty": rng.uniform(-2, 2),
            "logit_bias": {rng.randrange(500): rng.uniform(-100, 100) for _ in range(rng.randrange(1, 20))},
            "top_k": rng.choice([0, 20]), "min_p": rng.choice([0.0, 0.05])}


def run_crowded(engine, rng: random.Random, prompt, params, env, companions: int, processing: bool = False):
    """The request beside `companions` random others, arriving anywhere among them (with
    `processing`, the others draw penalties, biases and truncation too)."""
    prompts = [prompt]
    all_params = [params]
    envs = [env]
    for _ in range(companions):
        length = rng.randrange(1, 200)
        prompts.append([rng.randrange(2, 500) for _ in range(length)])
        all_params.append(
            SamplingParams(
                max_tokens=rng.randrange(1, 20),
                temperature=rng.choice([0.0, 0.7, 1.3]),
                seed=rng.randrange(1000),
                ignore_eos=True,
                **(random_processing(rng) if processing else {}),
            )
        )
        envs.append(envelope(f"c{rng.randrange(5)}", deterministic=rng.random() < 0.3))
    order = list(range(len(prompts)))
    rng.shuffle(order)  # the request under test arrives anywhere among its companions
    results = engine.generate([prompts[i] for i in order], [all_params[i] for i in order], [envs[i] for i in order])
    return results[order.index(0)]


def _mistral_with_window(path):
    import json

    from devkit.checkpoints import write_checkpoint

    write_checkpoint(path, "mistral", num_heads=8, num_kv_heads=2, seed=3)
    config = json.loads((path / "config.json").read_text())
    config["sliding_window"] = 24
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module", params=["llama-gqa2", "mistral-gqa4-window24"])
def engines(request, tiny_dir, tmp_path_factory):
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    if request.param == "llama-gqa2":
        model, requests = tiny_dir, NUM_REQUESTS
    else:
        model, requests = _mistral_with_window(tmp_path_factory.mktemp("mistral")), 20
    engines = [
        # float32, as these ran before bf16 became the CPU default; the SmolLM2 test below covers bf16.
        LLMEngine(EngineConfig(model=str(model), dtype="float32", kv_cache_memory_bytes=32 << 20,
                               max_num_batched_tokens=budget))
        for budget in (2048, 37)
    ]
    return engines, requests


def test_deterministic_requests_are_bit_identical_under_load(engines) -> None:
    engines, num_requests = engines
    rng = random.Random(1234)
    hits = 0
    for case in range(num_requests):
        prompt = [rng.randrange(2, 500) for _ in range(rng.randrange(2, 300))]
        params = SamplingParams(
            max_tokens=rng.randrange(4, 12),
            temperature=rng.choice([0.0, 0.9]),
            seed=rng.randrange(10_000),
            ignore_eos=True,
            keep_logits=True,
        )
        env = envelope(f"tenant-{case}", deterministic=True)  # a fresh namespace: the first run is cold
        companions = rng.randrange(1, 32)

        def alone(engine):
            return engine.generate([prompt], params, env)[0]  # noqa: B023 - called in this iteration only

        def crowded(engine):
            return run_crowded(engine, rng, prompt, params, env, companions)  # noqa: B023 - called in this iteration only

        # Engine 0 (no chunking): cold and alone, then cached and crowded.
        # Engine 1 (37-token budget, so prompts are chunked): cold and crowded, then cached and alone.
        runs = [alone(engines[0]), crowded(engines[0]), crowded(engines[1]), alone(engines[1])]
        reference = runs[0]
        assert reference.num_cached_tokens == 0 and runs[2].num_cached_tokens == 0
        for result in runs[1:]:
            assert result.token_ids == reference.token_ids, f"case {case}: tokens differ"
            assert len(result.logits) == len(reference.logits)
            for step, (a, b) in enumerate(zip(result.logits, reference.logits)):
                assert torch.equal(a, b), f"case {case}, step {step}: logits differ"
        if runs[1].num_cached_tokens > 0 and runs[3].num_cached_tokens > 0:
            hits += 1
    assert hits > num_requests // 2  # most prompts span a full block, so their repeats hit
    for engine in engines:
        engine.check_invariants()
        assert engine.scheduler.num_prefix_hit_tokens > 0


def test_penalized_and_biased_deterministic_requests_stay_bit_identical_under_load(engines) -> None:
    """Penalties and logit_bias read a row's own tokens and touch only its own logits: the lane's
    guarantee holds with them on, beside companions that use them too."""
    engines, num_requests = engines
    rng = random.Random(4321)
    changed, cases = 0, num_requests // 5
    for case in range(cases):
        prompt = [rng.randrange(2, 500) for _ in range(rng.randrange(2, 300))]
        params = SamplingParams(max_tokens=rng.randrange(6, 14), temperature=rng.choice([0.0, 0.9]),
                                seed=rng.randrange(10_000), ignore_eos=True, keep_logits=True,
                                presence_penalty=rng.uniform(0.5, 2), frequency_penalty=rng.uniform(0.5, 2),
                                logit_bias={rng.randrange(500): 5.0, rng.randrange(500): -100.0})
        env = envelope(f"penalized-{case}", deterministic=True)
        reference = engines[0].generate([prompt], params, env)[0]
        plain = engines[0].generate([prompt], dataclasses.replace(params, presence_penalty=0, frequency_penalty=0,
                                                                  logit_bias=()), env)[0]
        changed += plain.token_ids != reference.token_ids
        for engine in engines:
            result = run_crowded(engine, rng, prompt, params, env, rng.randrange(1, 32), processing=True)
            assert result.token_ids == reference.token_ids, f"case {case}: tokens differ"
            for step, (a, b) in enumerate(zip(result.logits, reference.logits)):
                assert torch.equal(a, b), f"case {case}, step {step}: logits differ"
    assert changed > cases // 2, "the penalties and biases seldom changed the tokens: the test proves little"


def test_public_segment_blocks_give_every_tenant_the_same_bits(engines) -> None:
    """A public block computed once, by whichever tenant came first, is the block each tenant's own
    cold run would have computed: tokens and logits bit for bit, crowded, chunked or not."""
    engines, _ = engines
    rng = random.Random(77)
    system = [rng.randrange(2, 500) for _ in range(40)]  # two whole blocks of 16, and 8 tokens over
    public = (segment(system),)
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, keep_logits=True)
    for e, engine in enumerate(engines):
        hits = 0
        for t in range(4):
            prompt = system + [rng.randrange(2, 500) for _ in range(rng.randrange(1, 40))]
            cold = engine.generate([prompt], params, envelope(f"cold-{e}-{t}", deterministic=True))[0]
            shared = run_crowded(engine, rng, prompt, params,
                                 envelope(f"segment-{e}-{t}", deterministic=True, segments=public), 3)
            assert cold.num_cached_tokens == 0
            assert shared.token_ids == cold.token_ids, f"engine {e}, tenant {t}: tokens differ"
            for step, (a, b) in enumerate(zip(shared.logits, cold.logits, strict=True)):
                assert torch.equal(a, b), f"engine {e}, tenant {t}, step {step}: logits differ"
            hits += shared.num_cached_tokens == 32
        assert hits >= 3  # the first tenant computed the public blocks; the others read them
        engine.check_invariants()


def test_smollm2_is_bit_identical_alone_crowded_cached_chunked_and_preempted(smollm2_dir) -> None:
    """The default model in the serving dtype ('auto': bfloat16 on a CPU with bf16 instructions)."""
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from engine.telemetry import ListSink

    def engine(sinks=(), max_model_len=640, **config) -> LLMEngine:
        return LLMEngine(EngineConfig(model=str(smollm2_dir), max_model_len=max_model_len, **config), sinks=sinks)

    roomy, chunked = engine(kv_cache_memory_bytes=64 << 20), engine(kv_cache_memory_bytes=64 << 20,
                                                                     max_num_batched_tokens=37)
    rng = random.Random(99)
    tokenizer = roomy.tokenizer
    for case, question in enumerate(["What is the capital of France?"]):
        prompt = tokenizer.encode_chat([{"role": "user", "content": question}])
        params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, keep_logits=True)
        env = envelope(f"smol-{case}", deterministic=True)
        reference = roomy.generate([prompt], params, env)[0]
        runs = [run_crowded(roomy, rng, prompt, params, env, 3),  # cached and crowded
                chunked.generate([prompt], params, env)[0],  # cold, chunked prefill
                run_crowded(chunked, rng, prompt, params, env, 3)]
        # A pool that holds exactly an earlier 35-block prompt of its tenant and this one: the other's
        # first decode needs a block, so this request, the tenant's latest arrival, is preempted.
        blocks = 35 + -(-len(prompt) // 16)
        sink = ListSink()
        tight = engine([sink], max_model_len=blocks * 16, num_kv_blocks=blocks)
        other = SamplingParams(max_tokens=20, temperature=0.8, seed=case, ignore_eos=True)
        filler = [rng.randrange(2, 40000) for _ in range(35 * 16)]
        preempted = tight.generate([filler, prompt], [other, params], [envelope(f"smol-{case}"), env])[1]
        record = next(r for r in sink.requests if r.request_id == preempted.request_id)
        assert record.preemptions > 0, f"case {case}: the tight pool did not preempt the request"
        tight.check_invariants()
        runs.append(preempted)
        for result in runs:
            assert result.token_ids == reference.token_ids, f"case {case}: tokens differ"
            for step, (a, b) in enumerate(zip(result.logits, reference.logits)):
                assert torch.equal(a, b), f"case {case}, step {step}: logits differ"
    assert str(roomy.runner.dtype) == ("torch.bfloat16" if cpu_has_native_bf16() else "torch.float32")
    for e in (roomy, chunked):
        e.check_invariants()
