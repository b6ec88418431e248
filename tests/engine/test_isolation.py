"""Who may share a step, and who is served next."""

from __future__ import annotations

import random

from engine.envelope import Isolation
from engine.sampling_params import SamplingParams
from tests.utils.envelopes import envelope


def record_batches(engine) -> list:
    batches = []
    schedule = engine.scheduler.schedule

    def recording():
        batch = schedule()
        if batch:
            batches.append([(seq.request_id, seq.envelope) for seq in batch.seqs])
        return batch

    engine.scheduler.schedule = recording
    return batches


def assert_isolated(batch) -> None:
    isolations = {env.isolation for _, env in batch}
    if Isolation.EXCLUSIVE in isolations:
        assert len(batch) == 1, "an exclusive request shared its step"
    if Isolation.TENANT in isolations:
        assert len({env.isolation_key for _, env in batch}) == 1, "a tenant-isolated request met another tenant"
        assert isolations == {Isolation.TENANT}


def finish_order(engine) -> list[str]:
    order = []
    while engine.has_unfinished_requests():
        order += [out.request_id for out in engine.step() if out.finished]
    return order


def test_steps_respect_isolation_classes(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir), max_num_batched_tokens=64)
    batches = record_batches(engine)
    rng = random.Random(7)
    for i in range(30):
        env = envelope(f"t{rng.randrange(4)}", isolation=rng.choice(["shared", "tenant", "exclusive"]))
        prompt = [rng.randrange(2, 500) for _ in range(rng.randrange(4, 40))]
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=rng.randrange(1, 6), seed=i), env)
    finish_order(engine)
    assert len(batches) > 30
    assert any(len(b) > 1 for b in batches)  # sharing still happens where it is allowed
    for batch in batches:
        assert_isolated(batch)


def test_a_deep_queue_does_not_starve_another_tenant(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir), max_num_seqs=2)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for i in range(12):
        engine.add_request(f"a{i}", [5, 6, 7, 8], params, envelope("busy"))
    for i in range(2):
        engine.add_request(f"b{i}", [5, 6, 7, 8], params, envelope("quiet"))
    order = finish_order(engine)
    assert max(order.index("b0"), order.index("b1")) < 6  # FCFS would finish them last (12, 13)


def test_a_tenant_lane_does_not_starve_the_shared_lane(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir), max_num_seqs=4)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    for i in range(10):
        engine.add_request(f"iso{i}", [9] * 20, params, envelope("iso", isolation="tenant"))
    engine.add_request("shared", [9] * 20, params, envelope("other"))
    order = finish_order(engine)
    # The first four took every slot before it arrived; it gets the first slot that frees.
    assert order.index("shared") < order.index("iso4")


def test_priority_orders_a_tenants_queue(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir), max_num_seqs=1)
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"low{i}", [3, 4, 5], params, envelope("t1", priority=0))
    engine.add_request("high", [3, 4, 5], params, envelope("t1", priority=5))
    order = finish_order(engine)
    assert order[0] == "high"


def test_one_exclusive_request_per_tenant_runs_at_a_time(tiny_dir, make_engine) -> None:
    engine = make_engine(model=str(tiny_dir))
    batches = record_batches(engine)
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    for i in range(4):
        engine.add_request(f"x{i}", [3, 4, 5, 6], params, envelope("t1", isolation="exclusive"))
    engine.add_request("s", [3, 4, 5, 6], params, envelope("t2"))
    order = finish_order(engine)
    assert order.index("s") < 2  # four exclusive requests are one lane's turns, not four
    assert all(len(b) == 1 for b in batches)
