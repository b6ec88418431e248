"""n > 1: the choices of one request share the prompt's full KV blocks (forked, not recomputed),
sample apart, and give every block back, however each of them ends."""

from __future__ import annotations

import gc
import weakref

import pytest

from engine.llm_engine import RequestError
from engine.sampling_params import SamplingParams
from engine.telemetry import ListSink
from tests.utils.envelopes import ENV, envelope

# 60 tokens or so with the tiny tokenizer: three full blocks of 16 and a partial one.
PROMPT = "The gateway verifies every token it is given, and the engine shares what it may. " * 2


def sampled(**kw) -> SamplingParams:
    kw.setdefault("max_tokens", 12)
    kw.setdefault("ignore_eos", True)
    kw.setdefault("temperature", 1.0)
    return SamplingParams(**kw)


def run(engine, request_id: str, tokens: dict[int, list[int]] | None = None, steps: int = 1000) -> dict[int, list[int]]:
    """Steps (at most `steps`, or to the end) and adds each choice's new tokens to `tokens`."""
    tokens = {} if tokens is None else tokens
    while engine.has_unfinished_requests() and steps:
        steps -= 1
        for out in engine.step():
            if out.request_id == request_id:
                tokens.setdefault(out.index, []).extend(out.new_token_ids)
    return tokens


def step_until_forked(engine, seq) -> dict[int, list[int]]:
    tokens: dict[int, list[int]] = {}
    for _ in range(10):
        if all(c.block_table for c in seq.choices):
            return tokens
        run(engine, seq.request_id, tokens, steps=1)
    raise AssertionError("the choices never forked")


def test_choices_share_the_prompts_full_blocks_charged_once(tiny_dir, make_engine) -> None:
    sink = ListSink()
    engine = make_engine(model=str(tiny_dir))
    engine.sinks.append(sink)
    seq = engine.add_request("r", PROMPT, sampled(n=3, seed=7), envelope=ENV)
    bs = engine.config.block_size
    shared = (seq.num_prompt_tokens - 1) // bs
    assert shared >= 2
    tokens = step_until_forked(engine, seq)
    run(engine, "r", tokens, steps=1)  # each choice computes the rest of its prompt in a block of its own
    bm = engine.scheduler.block_manager
    tables = [list(c.block_table) for c in seq.choices]
    assert tables[0][:shared] == tables[1][:shared] == tables[2][:shared]
    assert all(bm.blocks[b].ref_count == 3 for b in tables[0][:shared])
    tails = [set(t[shared:]) for t in tables]
    assert all(tails) and not (tails[0] & tails[1] or tails[0] & tails[2] or tails[1] & tails[2])
    # Charged once: the tenant pays for each distinct block, not for each choice holding it.
    assert bm.charged[ENV.isolation_key] == len({b for t in tables for b in t})
    run(engine, "r", tokens)
    assert sorted(tokens) == [0, 1, 2] and all(len(t) == 12 for t in tokens.values())
    assert len({tuple(t) for t in tokens.values()}) > 1  # sampled apart
    assert all(bm.blocks[b].ref_count == 0 for b in tables[0])
    (record,) = [r for r in sink.requests if r.request_id == "r"]
    assert (record.choices, record.shared_prefix_blocks, record.output_tokens) == (3, shared, 36)
    assert record.finish_reasons == ("length",) * 3 and record.decode["n"] == 3


def test_the_prompt_is_computed_once_for_all_choices(tiny_dir, make_engine) -> None:
    sink = ListSink()
    engine = make_engine(model=str(tiny_dir))
    engine.sinks.append(sink)
    # Scope none: no prefix cache, so only the fork can spare the choices their prefill.
    seq = engine.add_request("r", PROMPT, sampled(n=4, max_tokens=2), envelope=envelope(scope="none"))
    run(engine, "r")
    prompt, fork_at = seq.num_prompt_tokens, seq.fork_at
    assert fork_at == (prompt - 1) // engine.config.block_size * engine.config.block_size > 0
    # The shared blocks once, each choice's tail (under a block and one token), one decode each.
    assert sum(step.num_tokens for step in sink.steps) == fork_at + 4 * (prompt - fork_at) + 4


def test_a_preempted_choice_gives_back_only_its_hold_on_the_shared_blocks(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    seq = engine.add_request("r", PROMPT, sampled(n=3, seed=3), envelope=ENV)
    tokens = step_until_forked(engine, seq)
    run(engine, "r", tokens, steps=3)
    shared = seq.num_shared_blocks
    prefix = seq.block_table[:shared]
    child = seq.choices[2]
    engine.scheduler._preempt(child)
    assert not child.block_table and child.num_borrowed_blocks == 0
    assert all(engine.scheduler.block_manager.blocks[b].ref_count == 2 for b in prefix)
    engine.check_invariants()
    run(engine, "r", tokens)
    assert sorted(tokens) == [0, 1, 2] and all(len(t) == 12 for t in tokens.values())


def test_aborting_the_request_frees_every_choice(tiny_dir, make_engine) -> None:
    sink = ListSink()
    engine = make_engine(model=str(tiny_dir))
    engine.sinks.append(sink)
    seq = engine.add_request("r", PROMPT, sampled(n=3), envelope=ENV)
    step_until_forked(engine, seq)
    engine.step()
    finals = engine.abort_choices("r")
    assert sorted(f.index for f in finals) == [0, 1, 2] and {f.finish_reason for f in finals} == {"abort"}
    assert engine.kv_stats().num_used_blocks == 0
    assert not engine.has_unfinished_requests() and engine.abort_choices("r") == []
    assert not engine.runner.sampler._generators
    (record,) = sink.requests
    assert record.finish_reason == "abort" and record.choices == 3


def test_aborting_before_the_fork_ends_the_choices_not_yet_forked(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    engine.add_request("r", PROMPT, sampled(n=2), envelope=ENV)
    finals = engine.abort_choices("r")
    assert sorted(f.index for f in finals) == [0, 1]
    assert engine.kv_stats().num_used_blocks == 0 and not engine.has_unfinished_requests()


def test_seeded_choice_i_is_what_seed_plus_i_gives_alone(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    engine.add_request("a", PROMPT, sampled(n=3, seed=41), envelope=ENV)
    first = run(engine, "a")
    engine.add_request("b", PROMPT, sampled(n=3, seed=41), envelope=ENV)
    assert run(engine, "b") == first
    for choice in range(3):
        engine.add_request(f"alone-{choice}", PROMPT, sampled(seed=41 + choice), envelope=envelope(scope="none"))
        assert run(engine, f"alone-{choice}") == {0: first[choice]}


def test_a_short_prompt_forks_nothing_and_still_gives_n_choices(tiny_dir, make_engine) -> None:
    sink = ListSink()
    engine = make_engine(model=str(tiny_dir))
    engine.sinks.append(sink)
    engine.add_request("r", "Hi", sampled(n=2, seed=5), envelope=ENV)
    tokens = run(engine, "r")
    assert sorted(tokens) == [0, 1]
    (record,) = sink.requests
    assert record.shared_prefix_blocks == 0 and record.output_tokens == 24


def test_generate_returns_every_choice_in_order(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    results = engine.generate([PROMPT, "Hello"], [sampled(n=2, seed=1), sampled()], envelopes=ENV)
    assert [r.index for r in results] == [0, 1, 0]


def test_n_beyond_the_batch_or_the_kv_quota_is_refused(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir), max_num_seqs=4)
    with pytest.raises(RequestError, match="n may be at most 4") as refused:
        engine.add_request("r", PROMPT, sampled(n=5), envelope=ENV)
    assert refused.value.param == "n"
    # 4 shared blocks... each choice's own: the quota covers the shared ones once.
    bs = engine.config.block_size
    seq = engine.make_sequence("q", PROMPT, sampled(n=2, max_tokens=8), ENV)
    shared = seq.fork_at // bs
    own = engine.config.blocks_for(seq.num_prompt_tokens + 8) - shared
    engine.add_request("fits", PROMPT, sampled(n=2, max_tokens=8), envelope=envelope(quota=shared + 2 * own))
    with pytest.raises(RequestError, match="lower max_tokens or n"):
        engine.add_request("over", PROMPT, sampled(n=2, max_tokens=8), envelope=envelope(quota=shared + 2 * own - 1))
    run(engine, "fits")
    with pytest.raises(ValueError, match="n: must be an integer from 1 to 128"):
        SamplingParams(n=0)


def test_under_memory_pressure_the_last_choice_goes_first_and_all_finish(tiny_dir, make_engine) -> None:
    # A pool that holds the shared prompt and about one choice's tail: the choices must take turns.
    engine = make_engine(model=str(tiny_dir), num_kv_blocks=8, max_model_len=128)
    seq = engine.add_request("r", PROMPT, sampled(n=3, seed=2, max_tokens=30), envelope=ENV)
    tokens = step_until_forked(engine, seq)
    run(engine, "r", tokens, steps=40)
    assert engine.scheduler.num_preemptions > 0
    assert seq.num_preemptions <= min(c.num_preemptions for c in seq.choices[1:])
    run(engine, "r", tokens)
    assert sorted(tokens) == [0, 1, 2] and all(len(t) == 30 for t in tokens.values())


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("ending", ["finished", "aborted"])
def test_a_requests_sequences_go_when_it_ends_without_the_cyclic_collector(tiny_dir, make_engine, n, ending) -> None:
    # The choices share one list that each is in: cut once the last ends, or every request's
    # sequences (and their detokenizers, envelopes) would wait for the cyclic collector.
    engine = make_engine(model=str(tiny_dir))
    gc.collect()
    gc.disable()
    try:
        seq = engine.add_request("r", PROMPT, sampled(n=n, seed=7), envelope=ENV)
        step_until_forked(engine, seq)
        refs = [weakref.ref(choice) for choice in seq.choices]
        assert len(refs) == n
        if ending == "aborted":
            engine.abort_request("r")
        else:
            run(engine, "r")
        assert not engine.has_unfinished_requests()
        del seq
        assert [ref() for ref in refs] == [None] * n
    finally:
        gc.enable()
