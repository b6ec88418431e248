"""Prompt-lookup speculation: drafts from the request's own tokens, verified in one step, change no output."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from devkit.checkpoints import write_checkpoint
from engine.block_manager import BlockManager
from engine.config import EngineConfig
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence
from engine.speculation import propose_draft
from engine.telemetry import ListSink
from tests.utils.envelopes import envelope

GREEDY = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
SPEC = envelope(speculative=True)
PLAIN = envelope()
# A prompt that repeats itself, so the continuation copies from it, and two that do not.
COPYING = [5, 17, 33, 9, 81, 44, 12, 70] * 6 + [5, 17, 33]
PROMPTS = [COPYING, list(range(2, 60)), [300, 7, 300, 7, 300, 42, 11, 9, 300, 7]]


@pytest.fixture(scope="module")
def looping_dir(tmp_path_factory) -> Path:
    """A small random Llama whose attention and MLP write only a little into the residual stream:
    mostly a bigram model, so its greedy output falls into loops that drafts predict, but the
    context (the KV) still moves its logits, so a wrong KV shows. Drafts are both accepted and
    rejected on it (a random checkpoint rejects nearly all)."""
    path = write_checkpoint(tmp_path_factory.mktemp("looping"), "llama", seed=1)
    weights = load_file(path / "model.safetensors")
    for name in weights:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = weights[name] * 0.01
    save_file(weights, path / "model.safetensors", metadata={"format": "pt"})
    return path


def test_draft_follows_the_latest_occurrence_of_the_longest_suffix() -> None:
    tokens = [1, 2, 3, 4, 9, 2, 3, 5, 6, 1, 2, 3]
    # [1, 2, 3] occurred at 0 only: what followed it
    assert propose_draft(tokens, 3) == [4, 9, 2]
    # n = 2: [2, 3] last occurred at 5, followed by 5, 6
    assert propose_draft([7, 2, 3, 4, 2, 3, 5, 6, 8, 2, 3], 2) == [5, 6]
    # n = 1 when nothing longer matches; k bounds the draft; the suffix itself is no match
    assert propose_draft([4, 8, 9, 8], 5) == [9, 8]
    assert propose_draft([1, 2, 3], 4) == []
    assert propose_draft([1, 2, 1], 0) == []
    # the continuation stops at the end of the context
    assert propose_draft([6, 6], 4) == [6]


def _generate(engine, prompts, params, env):
    return [r.token_ids for r in engine.generate(prompts, params, env)]


@pytest.mark.parametrize("model", ["looping", "demo"])
def test_greedy_output_is_token_for_token_that_of_plain_decoding(model, looping_dir, make_engine) -> None:
    name = str(looping_dir) if model == "looping" else model
    plain = make_engine(model=name, num_speculative_tokens=0)
    spec = make_engine(model=name)
    for prompt in PROMPTS:  # one at a time: speculation runs for a lone decode only
        assert _generate(spec, [prompt], GREEDY, SPEC) == _generate(plain, [prompt], GREEDY, SPEC)
    assert plain.scheduler.num_draft_tokens == 0
    assert spec.scheduler.num_accepted_tokens > 0
    assert spec.scheduler.num_draft_tokens > spec.scheduler.num_accepted_tokens  # some were rejected, too


def _deltas(engine, prompt, params, env) -> list[list[int]]:
    engine.add_request("deltas", prompt, params, env)
    deltas = []
    while engine.has_unfinished_requests():
        deltas += [out.new_token_ids for out in engine.step()]
    return deltas


def test_stops_and_max_tokens_land_where_plain_decoding_puts_them(looping_dir, make_engine) -> None:
    plain = make_engine(model=str(looping_dir), num_speculative_tokens=0)
    spec = make_engine(model=str(looping_dir))
    # The prompt holds what the model will write after it, as a prompt to edit would: drafts
    # copy it, so steps accept tokens the output has not had yet.
    first = _generate(plain, [PROMPTS[1]], GREEDY, PLAIN)[0]
    prompt = PROMPTS[1] + first + PROMPTS[1]
    full = _generate(plain, [prompt], GREEDY, PLAIN)[0]
    deltas = _deltas(spec, prompt, GREEDY, SPEC)
    assert [t for d in deltas for t in d] == full
    for max_tokens in (1, 2, 5, 13, 29, 30, 31):
        params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        assert _generate(spec, [prompt], params, SPEC)[0] == full[:max_tokens]
    # A stop token in the middle of a step's accepted tokens ends the output there, as it would
    # one step at a time: the first token of a multi-token delta that occurs nowhere before it.
    start = 0
    for delta in deltas:
        if len(delta) >= 3 and delta[1] not in full[:start + 1]:
            stop = delta[1]
            break
        start += len(delta)
    else:
        pytest.fail("no step accepted two drafts with a new token among them")
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True, stop_token_ids=(stop,))
    assert _deltas(spec, prompt, params, SPEC)[-1][-1] == stop
    assert _generate(spec, [prompt], params, SPEC)[0] == full[: start + 2]


def test_only_lone_decodes_speculate_and_rejected_kv_is_never_cached(looping_dir, make_engine) -> None:
    """A later request that shares prompt and output with a speculative one reuses its cached blocks
    and decodes exactly what a fresh engine does: no block held a rejected draft token's KV."""
    spec = make_engine(model=str(looping_dir), block_size=4)
    fresh = make_engine(model=str(looping_dir), block_size=4, num_speculative_tokens=0)
    prompt = PROMPTS[2]
    first = _generate(spec, [prompt], GREEDY, SPEC)[0]
    assert spec.scheduler.num_draft_tokens > spec.scheduler.num_accepted_tokens > 0
    bm = spec.scheduler.block_manager
    context = prompt + first
    for block in bm.blocks:  # every cached block holds the tokens of its place in the context
        if block.hash is not None:
            assert list(block.token_ids) in [context[i:i + 4] for i in range(0, len(context) - 3, 4)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, keep_logits=True)
    later = spec.generate([context[:-1]], params, PLAIN)[0]
    again = fresh.generate([context[:-1]], params, PLAIN)[0]
    assert later.num_cached_tokens >= len(prompt)
    assert later.token_ids == again.token_ids
    for a, b in zip(later.logits, again.logits):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-4)
    # two requests in one step: neither speculates (the shorter one finishes first; then the other may)
    sink = ListSink()
    spec.sinks.append(sink)
    short = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    spec.generate([prompt, PROMPTS[1]], [GREEDY, short], SPEC)
    shared = [step for step in sink.steps if step.num_seqs > 1]
    assert len(shared) >= 20 and all(step.num_draft_tokens == 0 for step in shared)
    assert any(step.num_draft_tokens for step in sink.steps if step.num_seqs == 1)


def test_deterministic_lane_and_unsupported_requests_never_speculate(looping_dir, make_engine) -> None:
    sink = ListSink()
    engine = make_engine(model=str(looping_dir), block_size=4)
    engine.sinks.append(sink)
    det = envelope(deterministic=True)
    assert not det.speculative  # the schema refuses deterministic with speculative
    forced = type(det)(**{**det.__dict__, "speculative": True})  # an envelope that asks anyway
    engine.generate([COPYING], GREEDY, forced)
    for params in (
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logprobs=1),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, presence_penalty=0.5),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, logit_bias={3: 1.0}),
        SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, n=2),
        SamplingParams(temperature=0.8, max_tokens=20, ignore_eos=True, seed=7),
    ):
        engine.generate([COPYING], params, SPEC)
    engine.generate([COPYING], GREEDY, PLAIN)  # the policy said no
    assert engine.scheduler.num_draft_tokens == 0
    assert all(step.num_draft_tokens == 0 for step in sink.steps)
    engine.generate([COPYING], GREEDY, SPEC)
    assert engine.scheduler.num_draft_tokens > 0
    drafted = [s for s in sink.steps if s.num_draft_tokens]
    assert drafted and all(s.num_seqs == 1 and s.num_tokens == 1 + s.num_draft_tokens for s in drafted)
    assert sum(s.num_accepted_tokens for s in sink.steps) == engine.scheduler.num_accepted_tokens
    record = sink.requests[-1]
    assert (record.draft_tokens, record.accepted_tokens) == (engine.scheduler.num_draft_tokens,
                                                             engine.scheduler.num_accepted_tokens)


def test_a_draft_takes_only_spare_blocks_and_gives_back_the_rejected_ones() -> None:
    config = EngineConfig(block_size=4, num_speculative_tokens=6)
    scheduler = Scheduler(config, BlockManager(num_blocks=8, block_size=4))
    seq = Sequence("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], GREEDY, 1024, 0, SPEC)
    scheduler.add(seq)
    batch = scheduler.schedule()  # the prefill
    scheduler.advance(batch, 0.0, 0.0)
    seq.append_token(3)
    batch = scheduler.schedule()
    assert seq.draft_token_ids == [4, 5, 6, 7, 8, 9] and batch.num_new_tokens == [7]
    assert len(seq.block_table) == 5  # 18 slots, for positions 0..17
    scheduler.advance(batch, 0.0, 0.0, [2])  # the model agreed with 4, 5
    assert seq.token_ids[-3:] == [3, 4, 5] and seq.num_computed_tokens == 14
    assert len(seq.block_table) == 4  # 15 slots: the tokens computed and the next one
    assert seq.draft_token_ids == [] and scheduler.num_accepted_tokens == 2
    scheduler.block_manager.check_invariants([seq])


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def test_rejection_sampling_keeps_each_tokens_distribution() -> None:
    """Verify draws token by token from the target distribution, whatever the draft: the first
    token's frequencies match p0, and the second's, given the first draft token was kept, match p1.
    (Sampling again from p0 on a rejection, without removing the draft token, fails the first.)"""
    torch.manual_seed(0)
    vocab = 6
    logits = torch.tensor([[1.0, 0.2, -0.5, 0.7, -1.0, 0.0],
                           [0.1, 1.2, 0.3, -0.4, 0.5, -2.0],
                           [0.0, 0.0, 1.0, 0.5, -0.5, 0.3]])
    params = SamplingParams(temperature=0.9, top_k=5, max_tokens=8)
    from engine.sampler import warp_logits

    probs = warp_logits(logits, [params] * 3).softmax(dim=-1)
    draft = [3, 1]
    sampler = Sampler(seed=1234)
    trials = 6000
    first = torch.zeros(vocab)
    second = torch.zeros(vocab)
    accepted_all = 0
    for i in range(trials):
        result = sampler.verify(logits, draft, f"r{i}", params)
        tokens = [s.token_id for s in result.accepted] + [result.token_id]
        first[tokens[0]] += 1
        if len(tokens) > 1:
            second[tokens[1]] += 1
        accepted_all += len(result.accepted) == 2
        sampler.release(f"r{i}")
    kept = probs[0] > 0
    # df = 4 (5 tokens kept by top_k): chi-square above 18.5 happens with probability 0.001
    assert _chi_square(first[kept], probs[0][kept]) < 18.5
    assert first[~kept].sum() == 0
    kept1 = probs[1] > 0
    assert _chi_square(second[kept1], probs[1][kept1]) < 18.5
    assert abs(accepted_all / trials - float(probs[0, 3] * probs[1, 1])) < 0.02


def test_greedy_verify_keeps_the_agreeing_prefix_and_the_models_token() -> None:
    logits = torch.full((4, 8), -1.0)
    for row, token in enumerate([5, 2, 7, 1]):
        logits[row, token] = 3.0
    sampler = Sampler(seed=0)
    params = SamplingParams(temperature=0)
    result = sampler.verify(logits, [5, 2, 4], "g", params)
    assert [s.token_id for s in result.accepted] == [5, 2] and result.token_id == 7
    result = sampler.verify(logits, [5, 2, 7], "g", params)
    assert [s.token_id for s in result.accepted] == [5, 2, 7] and result.token_id == 1
    result = sampler.verify(logits, [6, 2, 7], "g", params)
    assert result.accepted == () and result.token_id == 5


SMOLLM2_CHATS = [
    # copies from its prompt: an edit of a given text
    "Repeat the following text exactly, fixing any typos:\n\nThe gateway authenticates every request with "
    "Microsoft Entra ID, evaluates a Rego policy, and only then runs the model. Each tenant has its own prefix "
    "cache namespace, so one tenant never reuses another tenant's cached blocks.",
    "What is the capital of France?",
    "Write a short story about a robot.",
]


@pytest.mark.parametrize(("weights", "dtype"), [("quantized", "auto"), ("dequantized", "float32")])
def test_smollm2_greedy_output_is_that_of_plain_decoding_and_copies_are_accepted(smollm2_dir, weights,
                                                                                  dtype) -> None:
    """The default (quantized, bfloat16 where the CPU has it) and the oracles' path. A draft's rows
    attend as decodes and its 4 rows take the quantized kernels' small-row path, so each row's logits
    are those of a one-token step, bit for bit, and even a near-tie goes the same way."""
    from engine.llm_engine import LLMEngine

    def engine(k: int) -> LLMEngine:
        return LLMEngine(EngineConfig(model=str(smollm2_dir), dtype=dtype, kv_cache_memory_bytes=64 << 20,
                                      max_model_len=1024, weights=weights, num_speculative_tokens=k))

    plain, spec = engine(0), engine(3)
    params = SamplingParams(temperature=0, max_tokens=64)
    for chat in SMOLLM2_CHATS:
        prompt = plain.tokenizer.encode_chat([{"role": "user", "content": chat}])
        before = (spec.scheduler.num_draft_tokens, spec.scheduler.num_accepted_tokens)
        assert _generate(spec, [prompt], params, SPEC) == _generate(plain, [prompt], params, SPEC)
        if chat is SMOLLM2_CHATS[0]:
            drafted = spec.scheduler.num_draft_tokens - before[0]
            accepted = spec.scheduler.num_accepted_tokens - before[1]
            assert accepted > 0.6 * drafted  # the copy is mostly accepted
    spec.check_invariants()
