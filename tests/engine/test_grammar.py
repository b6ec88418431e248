"""Structured outputs in the engine: llguidance masks, applied batched, on the default model.

- apply_bitmask blocks exactly the tokens whose bit is 0 and leaves every other logit bit for
  bit as it was (the deterministic lane relies on it);
- a json_schema request on SmolLM2 answers JSON that validates, and stops when it is complete;
- a deterministic constrained request yields the same tokens and logits alone and beside
  constrained and unconstrained companions;
- a schema llguidance refuses is a RequestError naming response_format, before anything runs.
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch

from devkit.schemas import SCHEMAS
from engine.config import EngineConfig
from engine.grammar import apply_bitmask, bitmask_words
from engine.llm_engine import LLMEngine, RequestError
from engine.sampling_params import SamplingParams
from tests.engine.test_deterministic import run_crowded
from tests.utils.envelopes import envelope


@pytest.fixture(scope="module")
def smollm2(smollm2_dir) -> LLMEngine:
    return LLMEngine(EngineConfig(model=str(smollm2_dir), max_model_len=512, kv_cache_memory_bytes=64 << 20))


def prompt(engine: LLMEngine, name: str) -> list[int]:
    return engine.tokenizer.encode_chat([{"role": "user", "content": f"Give me a {name} as JSON."}])


@pytest.mark.parametrize("rows", [1, 7])
def test_apply_bitmask_blocks_exactly_the_cleared_bits_and_keeps_the_rest_bit_for_bit(rows) -> None:
    vocab = 1000  # not a multiple of 32: the last word's spare bits are ignored
    generator = torch.Generator().manual_seed(rows)
    allowed = torch.rand(rows, vocab, generator=generator) < 0.1
    bits = torch.zeros(rows, bitmask_words(vocab) * 32, dtype=torch.int64)
    bits[:, :vocab] = allowed.long()
    words = (bits.view(rows, -1, 32) << torch.arange(32)).sum(-1)
    bitmask = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    logits = torch.randn(rows, vocab, generator=generator)
    masked = apply_bitmask(logits.clone(), bitmask)
    assert torch.equal(masked[allowed], logits[allowed])
    assert bool((masked[~allowed] == float("-inf")).all())


def test_json_schema_answers_validate_and_stop_when_complete(smollm2) -> None:
    names = ["person", "nested", "enum_array", "pattern"]
    params = [SamplingParams(temperature=0, max_tokens=48, json_schema=json.dumps(SCHEMAS[n])) for n in names]
    results = smollm2.generate([prompt(smollm2, n) for n in names], params, envelope("grammar"))
    for name, result in zip(names, results):
        assert result.finish_reason == "stop", name
        jsonschema.validate(json.loads(result.text), SCHEMAS[name])
    unconstrained = smollm2.generate([prompt(smollm2, "person")], SamplingParams(temperature=0, max_tokens=48),
                                     envelope("grammar"))[0]
    with pytest.raises((ValueError, jsonschema.ValidationError)):  # the model alone does not: the mask did it
        jsonschema.validate(json.loads(unconstrained.text), SCHEMAS["person"])


def test_json_object_answers_an_object_even_when_sampled(smollm2) -> None:
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=40, json_schema='{"type": "object"}')
    result = smollm2.generate([prompt(smollm2, "shopping list")], params, envelope("grammar"))[0]
    if result.finish_reason == "stop":
        assert isinstance(json.loads(result.text), dict)
    else:  # cut off by max_tokens: still an object's prefix
        assert result.text.startswith("{")


def test_constrained_deterministic_requests_are_bit_identical_alone_and_crowded(smollm2) -> None:
    rng = random.Random(5)
    for case, name in enumerate(["mixed"]):
        params = SamplingParams(max_tokens=16, temperature=0.9, seed=case, keep_logits=True,
                                json_schema=json.dumps(SCHEMAS[name]))
        env = envelope(f"grammar-det-{case}", deterministic=True)
        reference = smollm2.generate([prompt(smollm2, name)], params, env)[0]
        # Companions: unconstrained random ones (run_crowded), and constrained ones beside them.
        companions = [SamplingParams(max_tokens=12, temperature=0.7, seed=i, json_schema=json.dumps(SCHEMAS[other]))
                      for i, other in enumerate(["person", "tags", "deep"])]
        crowded_constrained = smollm2.generate(
            [prompt(smollm2, "person"), prompt(smollm2, name), prompt(smollm2, "tags"), prompt(smollm2, "deep")],
            [companions[0], params, companions[1], companions[2]],
            [envelope("c1"), env, envelope("c2", deterministic=True), envelope("c3")])[1]
        for result in (run_crowded(smollm2, rng, prompt(smollm2, name), params, env, 5), crowded_constrained):
            assert result.token_ids == reference.token_ids, f"case {case}: tokens differ"
            assert len(result.logits) == len(reference.logits)
            for step, (a, b) in enumerate(zip(result.logits, reference.logits)):
                assert torch.equal(a, b), f"case {case}, step {step}: logits differ"
    smollm2.check_invariants()


@pytest.mark.parametrize("schema", ['{"type": "object", "properties": {"a": {"$ref": "#/nope"}}}',
                                    '{"type": "bogus"}', '{"type": "string", "pattern": "(unclosed"}'])
def test_a_schema_llguidance_refuses_is_a_request_error_on_response_format(smollm2, schema) -> None:
    with pytest.raises(RequestError) as caught:
        smollm2.make_sequence("bad", [1, 2, 3], SamplingParams(json_schema=schema), envelope("grammar"))
    assert caught.value.param == "response_format" and caught.value.code == "invalid_json_schema"
    assert str(caught.value).startswith("the JSON schema cannot be enforced: ")  # the caller's field goes first
    assert not smollm2.has_unfinished_requests()


def test_each_of_n_choices_walks_the_schema_on_its_own(smollm2) -> None:
    # The choices fork after the prompt; each has a grammar matcher of its own, so every sampled
    # choice validates (a shared matcher would be advanced by all of them at once and break).
    params = SamplingParams(temperature=1.0, seed=3, n=3, max_tokens=48, json_schema=json.dumps(SCHEMAS["person"]))
    results = smollm2.generate([prompt(smollm2, "person")], params, envelope("grammar"))
    assert len(results) == 3 and len({r.text for r in results}) > 1  # sampled apart
    for result in results:
        assert result.finish_reason == "stop"
        jsonschema.validate(json.loads(result.text), SCHEMAS["person"])
