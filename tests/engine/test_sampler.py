"""The sampler's logit processing against its oracles, on the same logits.

logit_bias, top-k, top-p and min-p against HF transformers' SequenceBiasLogitsProcessor,
TopKLogitsWarper, TopPLogitsWarper and MinPLogitsWarper (HF's RepetitionPenalty has other
semantics); presence and frequency penalties against OpenAI's documented formula in numpy.
Each batch mixes rows with and without the setting, and each row must match the oracle run
on that row alone, bit for bit: the ops are row-wise, whatever shares the batch.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.sampler import Sampler, inverse_cdf, process_logits, warp_logits
from engine.sampling_params import SamplingParams

VOCAB = 512
ROWS = 8


def random_logits(seed: int, rows: int = ROWS) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 4


def random_outputs(seed: int, rows: int = ROWS) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    # Few distinct ids, so tokens repeat and frequency differs from presence.
    return [rng.integers(0, 40, size=rng.integers(0, 30)).tolist() for _ in range(rows)]


def openai_penalties(logits: np.ndarray, output: list[int], presence: float, frequency: float) -> np.ndarray:
    """platform.openai.com/docs/advanced-usage: mu[j] -= c[j] * alpha_frequency + float(c[j] > 0) * alpha_presence."""
    counts = np.bincount(np.asarray(output, dtype=np.int64), minlength=logits.shape[-1]).astype(np.float32)
    penalty = counts * np.float32(frequency) + (counts > 0).astype(np.float32) * np.float32(presence)
    return logits - penalty


@pytest.mark.parametrize("seed", range(5))
def test_penalties_follow_openais_formula_row_by_row(seed) -> None:
    rng = np.random.default_rng(100 + seed)
    logits, outputs = random_logits(seed), random_outputs(seed)
    params = [SamplingParams(presence_penalty=float(rng.uniform(-2, 2)) if r % 3 else 0.0,
                             frequency_penalty=float(rng.uniform(-2, 2)) if r % 2 else 0.0) for r in range(ROWS)]
    processed = process_logits(logits, params, outputs)
    for r, p in enumerate(params):
        expected = openai_penalties(logits[r].numpy(), outputs[r], p.presence_penalty, p.frequency_penalty)
        np.testing.assert_array_equal(processed[r].numpy(), expected)
        alone = process_logits(logits[r : r + 1], [p], [outputs[r]])
        assert torch.equal(alone[0], processed[r]), f"row {r} depends on its batch"
    assert torch.equal(processed[0], logits[0])  # no penalty: untouched
    assert not torch.equal(processed[5], logits[5]) and outputs[5]


def test_penalties_count_repeats_and_the_edges_of_their_range() -> None:
    logits = torch.zeros(1, VOCAB)
    out = process_logits(logits, [SamplingParams(presence_penalty=2, frequency_penalty=-2)], [[7, 7, 7, 9]])[0]
    assert out[7].item() == -(3 * -2 + 2) and out[9].item() == -(1 * -2 + 2) and out[8].item() == 0


@pytest.mark.parametrize("seed", range(5))
def test_logit_bias_matches_hf_sequence_bias(seed) -> None:
    from transformers import SequenceBiasLogitsProcessor

    rng = np.random.default_rng(200 + seed)
    logits = random_logits(seed)
    params = []
    for r in range(ROWS):
        ids = rng.choice(VOCAB, size=int(rng.integers(1, 40)), replace=False).tolist() if r % 2 else []
        params.append(SamplingParams(logit_bias={str(t): float(rng.uniform(-100, 100)) for t in ids}))
    processed = process_logits(logits, params)
    dummy_ids = torch.zeros(1, 1, dtype=torch.long)
    for r, p in enumerate(params):
        if not p.logit_bias:
            assert torch.equal(processed[r], logits[r])
            continue
        hf = SequenceBiasLogitsProcessor([[[t], b] for t, b in p.logit_bias])(dummy_ids, logits[r : r + 1].clone())
        assert torch.equal(processed[r], hf[0]), f"row {r}"


def hf_warped(row: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    from transformers import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    # The order of transformers.GenerationMixin._get_logits_processor.
    warpers = [TemperatureLogitsWarper(p.temperature)]
    if p.top_k:
        warpers.append(TopKLogitsWarper(p.top_k))
    if p.top_p < 1:
        warpers.append(TopPLogitsWarper(p.top_p))
    if p.min_p:
        warpers.append(MinPLogitsWarper(p.min_p))
    scores, dummy_ids = row[None].clone(), torch.zeros(1, 1, dtype=torch.long)
    for warper in warpers:
        scores = warper(dummy_ids, scores)
    return scores[0]


@pytest.mark.parametrize("seed", range(6))
def test_top_k_top_p_and_min_p_keep_what_hf_warpers_keep(seed) -> None:
    rng = np.random.default_rng(300 + seed)
    logits = random_logits(seed)
    params = [SamplingParams(temperature=float(rng.choice([0.5, 1.0, 1.7])),
                             top_k=int(rng.choice([0, 1, 5, 60])),
                             top_p=float(rng.choice([1.0, 0.9, 0.3])),
                             min_p=float(rng.choice([0.0, 0.05, 0.3]))) for _ in range(ROWS)]
    warped = warp_logits(logits, params)
    for r, p in enumerate(params):
        expected = hf_warped(logits[r], p)
        kept = torch.isfinite(warped[r])
        assert torch.equal(kept, torch.isfinite(expected)), f"row {r}: {p}"
        torch.testing.assert_close(warped[r].softmax(-1), expected.softmax(-1), rtol=0, atol=1e-7)
        assert torch.equal(warp_logits(logits[r : r + 1], [p])[0], warped[r]), f"row {r} depends on its batch"


def test_min_p_alone_drops_exactly_the_tokens_below_its_floor() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.11, 0.09] + [0.0] * (VOCAB - 4)]) + 1e-30)
    warped = warp_logits(logits, [SamplingParams(min_p=0.2)])[0]
    assert torch.isfinite(warped).tolist()[:5] == [True, True, True, False, False]  # floor 0.1 = 0.2 x 0.5


def test_logit_bias_decides_greedy_and_sampled_tokens() -> None:
    sampler = Sampler(seed=0)
    logits = random_logits(9, rows=2)
    best = logits.argmax(-1).tolist()
    forced = int(logits[0].argmin())
    params = [SamplingParams(temperature=0, logit_bias={best[0]: -100}),
              SamplingParams(temperature=1.0, seed=3, logit_bias={forced: 100})]
    first, second = sampler.sample(logits, ["a", "b"], params)
    assert first.token_id != best[0] and first.token_id == int(logits[0].topk(2).indices[1])
    assert second.token_id == forced
    # Logprobs and kept logits stay the model's own, before any processing.
    kept = SamplingParams(temperature=0, logit_bias={forced: 100}, logprobs=0, keep_logits=True)
    lp = sampler.sample(logits[:1], ["c"], [kept])[0]
    assert lp.token_id == forced and torch.equal(lp.logits, logits[0])
    assert lp.logprobs.logprob == pytest.approx(torch.log_softmax(logits[0], -1)[forced].item())


def test_seeded_sampling_with_every_setting_is_reproducible() -> None:
    logits, outputs = random_logits(4), random_outputs(4)
    params = [SamplingParams(temperature=1.2, seed=s, top_k=50, min_p=0.02, presence_penalty=0.7,
                             frequency_penalty=0.4, logit_bias={3: 5.0}) for s in range(ROWS)]
    ids = [f"r{i}" for i in range(ROWS)]
    runs = [[s.token_id for s in Sampler(seed=1).sample(logits, ids, params, outputs)] for _ in range(2)]
    assert runs[0] == runs[1]
    assert len(set(runs[0])) > 1  # different seeds draw different tokens


def test_penalized_rows_need_their_outputs() -> None:
    with pytest.raises(ValueError, match="generated so far"):
        process_logits(random_logits(1, rows=1), [SamplingParams(presence_penalty=1)])


def test_inverse_cdf_draws_each_token_at_its_probability_and_never_a_zero_one() -> None:
    probs = torch.tensor([0.0, 0.5, 0.0, 0.3, 0.2, 0.0])
    n = 40_000
    uniforms = torch.rand(n, generator=torch.Generator().manual_seed(0))
    drawn = inverse_cdf(probs.expand(n, -1), uniforms)
    counts = torch.bincount(drawn, minlength=probs.numel()).double()
    assert counts[probs == 0].sum() == 0
    sigma = (n * probs.double() * (1 - probs.double())).sqrt()
    assert ((counts - n * probs.double()).abs() <= 4 * sigma + 1e-9).all(), counts.tolist()
    # The ends of [0, 1): the first and the last token with any probability.
    edges = inverse_cdf(probs.expand(2, -1), torch.tensor([0.0, 1.0 - 2**-24]))
    assert edges.tolist() == [1, 4]
