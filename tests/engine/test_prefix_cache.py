"""The prefix cache reuses KV only for the same namespace, model, lane and tokens."""

from __future__ import annotations

import dataclasses
from array import array
from collections import Counter

import pytest

from engine import EnvelopeError, segment_digest
from engine.block_manager import BlockManager, public_prefix
from engine.llm_engine import RequestError
from engine.sampling_params import SamplingParams
from engine.telemetry import ListSink
from gateway.policy.exceptions import DecisionSchemaError
from tests.engine.test_block_manager import compute_and_cache, make_seq
from tests.utils.envelopes import envelope, segment

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPT = list(range(2, 90))  # 88 tokens: five full blocks of 16 and a tail


def run(engine, request_id, prompt, env, params=GREEDY):
    engine.add_request(request_id, prompt, params, env)
    seq = engine.scheduler.find(request_id)
    tokens = []
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == request_id:
                tokens += out.new_token_ids
    return seq, tokens


def test_same_namespace_hits_and_gives_the_same_tokens(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    first, tokens = run(engine, "a", PROMPT, envelope("t1"))
    second, again = run(engine, "b", PROMPT, envelope("t1"))
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 80  # all five full blocks
    assert again == tokens


def test_a_shared_system_prompt_is_reused_up_to_the_first_difference(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    run(engine, "a", PROMPT, envelope("t1"))
    other = PROMPT[:40] + [7] * 48  # the same first 40 tokens: two full blocks
    seq, _ = run(engine, "b", other, envelope("t1"))
    assert seq.num_cached_tokens == 32


@pytest.mark.parametrize(
    "second",
    [
        envelope("t2"),  # another tenant
        envelope("t1", scope="principal", principal="someone-else"),  # another namespace of the same tenant
        envelope("t1", deterministic=True),  # another numerics lane
    ],
    ids=["other-tenant", "other-namespace", "other-lane"],
)
def test_no_reuse_across_namespaces_or_lanes(tiny_dir, make_engine, second) -> None:
    engine = make_engine(model=str(tiny_dir))
    run(engine, "a", PROMPT, envelope("t1"))
    seq, _ = run(engine, "b", PROMPT, second)
    assert seq.num_cached_tokens == 0


def test_scope_none_neither_reads_nor_writes(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    run(engine, "a", PROMPT, envelope("t1", scope="none"))
    assert engine.scheduler.block_manager.cached == {}
    run(engine, "b", PROMPT, envelope("t1"))
    seq, _ = run(engine, "c", PROMPT, envelope("t1", scope="none"))
    assert seq.num_cached_tokens == 0


def test_a_different_model_fingerprint_never_matches() -> None:
    bm = BlockManager(32, 4, fingerprint="model-a")
    compute_and_cache(bm, make_seq("a", 12, envelope("t1")))
    assert len(bm.match_prefix(make_seq("b", 13, envelope("t1")))[0]) == 3
    bm.fingerprint = "model-b"
    assert bm.match_prefix(make_seq("c", 13, envelope("t1")))[0] == []


def test_token_ids_are_verified_on_lookup() -> None:
    bm = BlockManager(32, 4)
    seq = make_seq("a", 12, envelope("t1"))
    compute_and_cache(bm, seq, keep=True)
    # Simulate a hash collision: the cached block's tokens differ from what the hash claims.
    victim = bm.blocks[seq.block_table[1]]
    victim.token_ids = array("q", [9, 9, 9, 9])
    ids, _ = bm.match_prefix(make_seq("b", 13, envelope("t1")))
    assert ids == seq.block_table[:1]
    bm.free(seq)


def test_at_least_one_token_is_left_to_compute() -> None:
    bm = BlockManager(32, 4)
    compute_and_cache(bm, make_seq("a", 8, envelope("t1")))
    ids, _ = bm.match_prefix(make_seq("b", 8, envelope("t1")))
    assert len(ids) == 1  # the block holding the last prompt token is recomputed to sample from it


def test_least_recently_used_cached_blocks_are_evicted_first() -> None:
    bm = BlockManager(6, 4)
    old = make_seq("old", 8, envelope("t1"), tokens=list(range(8)))
    new = make_seq("new", 8, envelope("t1"), tokens=list(range(100, 108)))
    for seq in (old, new):
        compute_and_cache(bm, seq)
    assert bm.num_cached_blocks == 4 and bm.num_free_blocks == 2
    taker = make_seq("taker", 16, envelope("t1"), tokens=list(range(200, 216)))
    assert bm.allocate(taker, 16)  # two free blocks, then the two oldest cached: old's
    assert bm.match_prefix(make_seq("x", 9, envelope("t1"), tokens=list(range(8)) + [0]))[0] == []
    assert len(bm.match_prefix(make_seq("y", 9, envelope("t1"), tokens=list(range(100, 108)) + [0]))[0]) == 2
    bm.free(taker)
    bm.check_invariants()


def test_a_tenant_at_quota_recycles_its_own_cached_blocks_not_others() -> None:
    bm = BlockManager(8, 4)
    victim = make_seq("victim", 8, envelope("t1"), tokens=list(range(8)))
    bm.set_quota(victim.tenant, 8)
    compute_and_cache(bm, victim)  # t1's prefix: two cached blocks

    flooder_env = envelope("t2", quota=4)
    bm.set_quota(flooder_env.isolation_key, 4)
    for i in range(5):  # t2 caches 16 tokens at a time, over and over
        compute_and_cache(bm, make_seq(f"flood-{i}", 16, flooder_env,
                                       tokens=list(range(1000 * (i + 1), 1000 * (i + 1) + 16))))
        bm.check_invariants()
        assert bm.charged[flooder_env.isolation_key] <= 4
    ids, _ = bm.match_prefix(make_seq("again", 9, envelope("t1"), tokens=list(range(8)) + [0]))
    assert len(ids) == 2  # t1's cached prefix survived the flood
    big = make_seq("too-big", 20, flooder_env)
    assert not bm.allocate(big, 20)  # five blocks never fit a four-block quota


def test_victims_next_request_still_hits_while_another_tenant_floods(tiny_dir, make_engine) -> None:
    # 32 blocks: the victim's prefix takes 6, the flooder may hold the other 26 and no more.
    engine = make_engine(model=str(tiny_dir), num_kv_blocks=32, block_size=16, max_model_len=512)
    victim = envelope("victim", quota=6)
    run(engine, "v1", PROMPT, victim)
    flood = envelope("flooder", quota=26)
    for i in range(6):
        prompt = [(i * 37 + j) % 500 + 2 for j in range(300)]
        run(engine, f"f{i}", prompt, flood, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    seq, _ = run(engine, "v2", PROMPT, victim)
    assert seq.num_cached_tokens == 80


def test_a_request_larger_than_its_quota_is_refused(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir), block_size=16)
    with pytest.raises(RequestError, match="quota of 4"):
        engine.add_request("big", PROMPT, SamplingParams(max_tokens=8), envelope("t1", quota=4))


def test_requests_without_an_envelope_are_refused(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    with pytest.raises(RequestError, match="execution envelope"):
        engine.add_request("bare", PROMPT, GREEDY, None)


def test_a_flood_past_the_pool_leaves_a_neighbours_share_alone(tiny_dir, make_engine) -> None:
    # 32 blocks, quotas of 20 and 32 that oversubscribe it: shares of 12 and 19.
    sink = ListSink()
    engine = make_engine(model=str(tiny_dir), num_kv_blocks=32, block_size=16, max_model_len=512)
    engine.sinks.append(sink)
    a, b = envelope("tenant-a", quota=20), envelope("tenant-b", quota=32)
    run(engine, "a1", PROMPT, a)  # a's five cached blocks
    flood = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    for i in range(6):  # b floods: 6 x 10 blocks, and its quota is the whole pool
        engine.add_request(f"b{i}", [(i * 37 + j) % 500 + 2 for j in range(120)], flood, b)
    # a's running request (5 blocks) arrives last: the latest arrival, once the first victim.
    long = SamplingParams(temperature=0, max_tokens=56, ignore_eos=True)
    a2, _ = run(engine, "a2", [(j * 11) % 500 + 2 for j in range(24)], a, long)
    a3, _ = run(engine, "a3", PROMPT, a)

    assert a2.num_preemptions == 0
    assert a3.num_cached_tokens == 80  # a's cached prefix survived the flood
    both = [{tag: (held + cached, share) for tag, held, cached, share in s.kv_tenants} for s in sink.steps]
    both = [h for h in both if a.tenant_digest in h and b.tenant_digest in h]
    assert both and all((h[a.tenant_digest][1], h[b.tenant_digest][1]) == (12, 19) for h in both)
    assert max(h[b.tenant_digest][0] for h in both) > 19  # b still bursts past its share into what a leaves free
    assert sum(s.num_preempted for s in sink.steps) > 0  # the pool was under pressure
    evicted = Counter()
    for step in sink.steps:
        evicted.update(dict(step.kv_evicted))
    assert evicted[b.tenant_digest] > 0 and a.tenant_digest not in evicted  # b recycled its own cache, never a's


# -- public prefix segments ---------------------------------------------------------

SYSTEM = list(range(300, 340))  # a 40-token public segment: two whole blocks of 16 and 8 tokens over


def with_segment(seq, block_size):
    seq.public_segment, seq.num_public_blocks = public_prefix(seq.envelope, seq.token_ids, block_size)
    return seq


def test_public_segment_blocks_are_shared_and_the_rest_stays_in_the_tenants_scope() -> None:
    bm = BlockManager(64, 4)
    public = (segment(SYSTEM),)
    question = [7, 8, 9, 10, 11, 12, 13, 14, 15]
    a = with_segment(make_seq("a", 49, envelope("t1", segments=public), tokens=SYSTEM + question), 4)
    assert a.num_public_blocks == 10  # 40 tokens: ten whole blocks of 4
    compute_and_cache(bm, a)
    # Another tenant given the same segment, with the very same question: only the public blocks match.
    b = with_segment(make_seq("b", 49, envelope("t2", segments=public), tokens=SYSTEM + question), 4)
    ids, hashes = bm.match_prefix(b)
    assert len(ids) == 10
    # The same tenant matches on, past the segment, through the same public blocks.
    again = with_segment(make_seq("c", 49, envelope("t1", segments=public), tokens=SYSTEM + question), 4)
    ids_again, hashes_again = bm.match_prefix(again)
    assert len(ids_again) == 12 and ids_again[:10] == ids and hashes_again[:10] == hashes


def test_without_the_segment_in_the_decision_nothing_is_shared() -> None:
    bm = BlockManager(64, 4)
    public = (segment(SYSTEM),)
    compute_and_cache(bm, with_segment(make_seq("a", 44, envelope("t1", segments=public), tokens=SYSTEM + [1] * 4), 4))
    # t2's decision names no segment, and t3's names another: neither reads t1's blocks.
    plain = with_segment(make_seq("b", 44, envelope("t2"), tokens=SYSTEM + [1] * 4), 4)
    other = with_segment(make_seq("c", 44, envelope("t3", segments=(segment(SYSTEM[:32]),)),
                                  tokens=SYSTEM + [1] * 4), 4)
    assert plain.public_segment is None and bm.match_prefix(plain)[0] == []
    assert other.num_public_blocks == 8 and bm.match_prefix(other)[0] == []
    # And a's blocks are not in t2's own namespace either: a's first block is keyed in the segment's.
    compute_and_cache(bm, plain)
    assert bm.match_prefix(with_segment(make_seq("d", 44, envelope("t2"), tokens=SYSTEM + [1] * 4), 4))[0]


def test_a_prompt_that_differs_from_the_segment_in_one_token_shares_nothing() -> None:
    bm = BlockManager(64, 4)
    public = (segment(SYSTEM),)
    compute_and_cache(bm, with_segment(make_seq("a", 44, envelope("t1", segments=public), tokens=SYSTEM + [1] * 4), 4))
    changed = SYSTEM[:39] + [3]  # the last token of the segment differs
    b = with_segment(make_seq("b", 44, envelope("t2", segments=public), tokens=changed + [1] * 4), 4)
    assert b.public_segment is None
    assert bm.match_prefix(b)[0] == []


def test_the_longest_matching_segment_wins_and_partial_blocks_stay_private() -> None:
    env = envelope("t1", segments=(segment(SYSTEM[:16]), segment(SYSTEM), segment(SYSTEM + [99])))
    found, blocks = public_prefix(env, SYSTEM + [5, 6], 16)
    assert found is not None and found.num_tokens == 40 and blocks == 2  # 41 tokens do not match; 8 left over
    assert public_prefix(envelope("t1", segments=(segment(SYSTEM[:10]),)), SYSTEM, 16) == (None, 0)  # no whole block


def test_segments_need_a_namespace_and_are_bounded() -> None:
    with pytest.raises(DecisionSchemaError, match="segments need scope tenant or principal"):
        envelope("t1", scope="none", segments=(segment(SYSTEM),))
    with pytest.raises(DecisionSchemaError, match="segments need scope"):
        envelope("t1", scope="shared", segments=(segment(SYSTEM),))
    with pytest.raises(DecisionSchemaError, match="segments"):
        envelope("t1", segments=tuple(segment(SYSTEM[:i]) for i in range(1, 18)))
    with pytest.raises(EnvelopeError, match="need a cache namespace"):
        dataclasses.replace(envelope("t1", scope="none"), public_segments=envelope(
            "t1", segments=(segment(SYSTEM),)).public_segments)


def test_engine_shares_a_platform_system_prompt_across_tenants_and_records_it(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    sink = ListSink()
    engine.sinks.append(sink)
    public = (segment(SYSTEM),)
    question_a, question_b = [3] * 20, [4] * 20
    reference_b = run(make_engine(model=str(tiny_dir)), "ref", SYSTEM + question_b, envelope("t2"))[1]
    first, _ = run(engine, "a", SYSTEM + question_a, envelope("t1", segments=public))
    second, tokens_b = run(engine, "b", SYSTEM + question_b, envelope("t2", segments=public))
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 32  # the two whole blocks inside the segment, computed by t1
    assert tokens_b == reference_b  # the shared KV is the KV t2 would have computed
    # t2's own suffix is cached for t2 only: t1 asking the same hits the public blocks alone.
    third, _ = run(engine, "c", SYSTEM + question_b, envelope("t1", segments=public))
    assert third.num_cached_tokens == 32
    records = {r.request_id: r for r in sink.requests}
    digest = segment_digest(SYSTEM).hex()
    assert [(records[i].public_segment, records[i].public_tokens) for i in "abc"] == [(digest, 32)] * 3
    plain, _ = run(engine, "d", SYSTEM + question_b, envelope("t2"))
    assert plain.num_cached_tokens == 0
    assert (records_d := [r for r in sink.requests if r.request_id == "d"][0]).public_segment == ""
    assert records_d.public_tokens == 0
