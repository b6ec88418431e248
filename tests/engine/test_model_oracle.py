"""The engine against Hugging Face transformers as the oracle, on small random checkpoints.

Tolerance: logits agree to atol=2e-4. Both sides compute in float32, but with different
reduction orders (fused QKV and gate/up matmuls, KV gathered from pages, batched vs
single-sequence matmul shapes), so results differ by rounding: on these checkpoints
(logits of magnitude ~12) the largest difference measured was 7.5e-5, and 2e-4 leaves
headroom for other CPUs' kernels. The checkpoints are scaled (init std 0.3) and their
seeds chosen so every greedy step's top-1/top-2 margin exceeds twice the tolerance; the
reference checks that, so rounding cannot flip a token and token ids must match exactly.
"""

from __future__ import annotations

import json

import pytest
import torch

from devkit.checkpoints import write_checkpoint
from devkit.oracle import ATOL, CHECKPOINTS, Reference, assert_matches, build_reference, greedy
from tests.utils.envelopes import ENV, envelope


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def reference(request, tmp_path_factory) -> Reference:
    spec = dict(CHECKPOINTS[request.param])
    path = write_checkpoint(tmp_path_factory.mktemp(request.param), spec.pop("arch"), **spec)
    return build_reference(path, seed=spec["seed"])


# Engine settings under which the results must not change.
MODES = {
    "sixteen_at_once": dict(max_num_seqs=16),
    "one_at_a_time": dict(max_num_seqs=1),
    "chunked_prefill": dict(max_num_batched_tokens=8),
    "preemption": dict(block_size=4, num_kv_blocks=24, max_model_len=96),
}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_greedy_matches_transformers(reference: Reference, make_engine, mode: str) -> None:
    engine = make_engine(model=str(reference.path), **MODES[mode])
    results = engine.generate(reference.prompts, greedy(), envelopes=ENV)
    assert_matches(reference, results)
    if mode == "chunked_prefill":
        assert engine.scheduler.num_chunked_prefills > 0
    if mode == "preemption":
        assert engine.scheduler.num_preemptions > 0


def test_deterministic_lane_matches_transformers(reference: Reference, make_engine) -> None:
    engine = make_engine(model=str(reference.path), max_num_batched_tokens=40)
    results = engine.generate(reference.prompts, greedy(), envelopes=envelope(deterministic=True))
    assert_matches(reference, results)


def test_requests_joining_between_steps_match(reference: Reference, make_engine) -> None:
    engine = make_engine(model=str(reference.path), max_num_batched_tokens=64)
    pending = list(enumerate(reference.prompts))
    token_ids: dict[int, list[int]] = {i: [] for i, _ in pending}
    logits: dict[int, list[torch.Tensor]] = {i: [] for i, _ in pending}
    while pending or engine.has_unfinished_requests():
        if pending:  # one new arrival per step, into a batch already decoding
            i, prompt = pending.pop(0)
            engine.add_request(str(i), prompt, greedy(), envelope=ENV)
        for out in engine.step():
            token_ids[int(out.request_id)] += out.new_token_ids
            logits[int(out.request_id)] += out.logits
    for i in token_ids:
        assert token_ids[i] == reference.tokens[i]
        torch.testing.assert_close(torch.stack(logits[i]), reference.logits[i], rtol=0, atol=ATOL)


def test_llama3_rope_scaling_matches(tmp_path, make_engine) -> None:
    rope = {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    }
    path = write_checkpoint(tmp_path / "llama3", "llama", rope_parameters=rope, seed=3)
    reference = build_reference(path, seed=3, max_len=200, count=4)
    engine = make_engine(model=str(path))
    assert_matches(reference, engine.generate(reference.prompts, greedy(), envelopes=ENV))


def test_mistral_sliding_window_matches(tmp_path, make_engine) -> None:
    path = write_checkpoint(tmp_path / "mistral", "mistral", seed=1)
    config = path / "config.json"
    raw = json.loads(config.read_text())
    raw["sliding_window"] = 24
    config.write_text(json.dumps(raw))
    reference = build_reference(path, seed=1, max_len=60, count=4)
    engine = make_engine(model=str(path), max_num_batched_tokens=16)
    assert_matches(reference, engine.generate(reference.prompts, greedy(), envelopes=ENV))


def test_sharded_checkpoint_loads(tmp_path, make_engine) -> None:
    path = write_checkpoint(tmp_path / "sharded", "llama", seed=5, max_shard_size="400KB")
    assert (path / "model.safetensors.index.json").is_file()
    reference = build_reference(path, seed=5, count=2)
    engine = make_engine(model=str(path))
    assert_matches(reference, engine.generate(reference.prompts, greedy(), envelopes=ENV))
