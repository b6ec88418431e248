from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import generate_latest

from engine import telemetry
from engine.sampling_params import SamplingParams
from engine.telemetry import ListSink, PrometheusSink
from tests.utils.envelopes import envelope

SECRET_TEXT = "the launch code is swordfish-42"
REGIMES = {"normal", "memory_pressured", "queue_degraded", "isolation_strict"}


def test_records_hold_digests_and_numbers_only(tiny_dir, make_engine) -> None:
    sink, metrics = ListSink(), PrometheusSink()
    engine = make_engine(model=str(tiny_dir))
    engine.sinks += [sink, metrics]
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    env = envelope("acme-corp", scope="tenant", isolation="tenant")
    engine.generate([SECRET_TEXT, SECRET_TEXT], params, env)

    assert len(sink.requests) == 2 and sink.steps
    prompt_ids = engine.tokenizer.encode(SECRET_TEXT)
    dump = repr(sink.requests) + repr(sink.steps)
    for needle in ("swordfish", "launch code", "acme-corp", str(prompt_ids)[1:-1]):
        assert needle not in dump

    first, second = sorted(sink.requests, key=lambda r: r.request_id)
    assert first.raw_prompt_digest == second.raw_prompt_digest  # same prompt, same digest
    assert len(first.raw_prompt_digest) == 32 and first.output_digest != first.effective_prompt_digest
    assert first.model_fingerprint == engine.fingerprint
    assert first.prompt_tokens == len(prompt_ids) and first.output_tokens == 6
    assert first.isolation == "tenant" and first.cache_scope == "tenant"
    assert len(first.top_margins) == 4 and all(m >= 0 for m in first.top_margins)
    assert 0 <= first.queue_ms <= first.ttft_ms <= first.e2e_ms
    assert first.finish_reason == "length" and first.truncated is False

    for step in sink.steps:
        assert step.regime in REGIMES
        assert step.lane == "tenant" and step.regime == "isolation_strict"
        assert step.num_seqs == len(step.members) and step.step_ms > 0
        assert len(step.batch_fingerprint) == 32
        assert [tag for tag, *_ in step.kv_tenants] == [env.tenant_digest]  # per-tenant KV by digest only

    exposition = generate_latest(metrics.registry).decode()
    assert "tenantgate_engine_time_to_first_token_seconds_count 2.0" in exposition
    assert 'tenantgate_prefix_cache_query_tokens_total{scope="tenant"}' in exposition
    assert 'tenantgate_steps_total{lane="tenant",regime="isolation_strict"}' in exposition
    assert "acme" not in exposition and env.tenant_digest not in exposition


def test_aborted_requests_leave_a_record(tiny_dir, make_engine) -> None:
    sink = ListSink()
    engine = make_engine(model=str(tiny_dir))
    engine.sinks.append(sink)
    engine.add_request("gone", "hello there", SamplingParams(max_tokens=50), envelope())
    engine.step()
    engine.abort_request("gone")
    assert [r.finish_reason for r in sink.requests] == ["abort"]
    assert dataclasses.asdict(sink.requests[0])["output_tokens"] == 1


def test_kv_gauge_reads_zero_used_once_requests_finish(tiny_dir, make_engine) -> None:
    metrics = PrometheusSink()
    engine = make_engine(model=str(tiny_dir))
    engine.sinks.append(metrics)
    metrics.watch(engine)
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    engine.generate([SECRET_TEXT, "a second prompt of other words"], params, envelope())

    def gauge(state: str) -> float | None:
        return metrics.registry.get_sample_value("tenantgate_kv_blocks", {"state": state})

    stats = engine.kv_stats()
    assert stats.num_used_blocks == 0 and stats.num_cached_blocks > 0  # the finished prompts stay cached
    assert gauge("used") == 0
    assert (gauge("free"), gauge("cached")) == (stats.num_free_blocks, stats.num_cached_blocks)


def test_records_meter_kv_block_seconds_and_engine_time(tiny_dir, make_engine, monkeypatch) -> None:
    """Chargeback figures: the blocks a request held, integrated over its life (in steps and
    between them), and the time of the steps it ran in, on a clock the test drives."""
    import time

    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    sink = ListSink()
    engine = make_engine(model=str(tiny_dir))
    engine.sinks.append(sink)
    held = []  # blocks the request held during each step
    run = engine.runner.run

    def timed_run(batch):
        held.append(len(batch.seqs[0].block_table))
        now[0] += 1.0  # each step takes one second
        return run(batch)

    engine.runner.run = timed_run
    engine.add_request("metered", "a prompt long enough for a few blocks of kv " * 3,
                       SamplingParams(max_tokens=20, temperature=0, ignore_eos=True), envelope())
    now[0] += 2.0  # queued, holding nothing
    while engine.has_unfinished_requests():
        engine.step()
        now[0] += 0.5  # between steps the blocks stay held
    [record] = sink.requests
    assert len(held) == 20 and held[-1] > held[0] > 0  # the table grew as tokens were appended
    assert record.engine_ms == 20 * 1000.0
    assert record.kv_block_seconds == sum(held) * 1.0 + sum(held[:-1]) * 0.5  # the last step ends it


def test_engine_gauges_read_the_scheduler_and_pool_at_scrape_time(tiny_dir, make_engine) -> None:
    """Running, waiting, preemptions and KV usage (what vLLM users look for), true between steps too."""
    metrics = PrometheusSink()
    engine = make_engine(model=str(tiny_dir), block_size=4, num_kv_blocks=24, max_model_len=96, max_num_seqs=2)
    engine.sinks.append(metrics)
    metrics.watch(engine)

    def sample(name: str) -> float | None:
        return metrics.registry.get_sample_value(name)

    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", f"prompt number {i} with a few words more", params, envelope())
    assert (sample("tenantgate_engine_requests_running"), sample("tenantgate_engine_requests_waiting")) == (0, 3)
    assert sample("tenantgate_kv_cache_usage_ratio") == 0
    engine.step()
    assert (sample("tenantgate_engine_requests_running"), sample("tenantgate_engine_requests_waiting")) == (2, 1)
    used = engine.kv_stats().num_used_blocks
    assert used > 0 and sample("tenantgate_kv_cache_usage_ratio") == pytest.approx(used / 24)
    while engine.has_unfinished_requests():
        engine.step()
    # Two sequences of 40 tokens and more outgrow 24 blocks of 4: the pool preempted one.
    assert sample("tenantgate_engine_preemptions_total") == engine.scheduler.num_preemptions > 0
    assert (sample("tenantgate_engine_requests_running"), sample("tenantgate_engine_requests_waiting")) == (0, 0)
    assert sample("tenantgate_kv_cache_usage_ratio") == 0  # finished prompts stay cached, and evictable


def test_the_kv_pool_gauge_reads_true_after_aborts_on_an_idle_engine(tiny_dir, make_engine) -> None:
    """Aborting every request frees its blocks with no step after it: the pool gauge must say so
    (it was set from step records only, and kept the aborted requests' blocks as used)."""
    metrics = PrometheusSink()
    engine = make_engine(model=str(tiny_dir), block_size=4, num_kv_blocks=24, max_model_len=96, max_num_seqs=2)
    engine.sinks.append(metrics)
    metrics.watch(engine)

    def pool(state: str) -> float | None:
        return metrics.registry.get_sample_value("tenantgate_kv_blocks", {"state": state})

    params = SamplingParams(max_tokens=40, temperature=0, ignore_eos=True)
    for i in range(2):
        engine.add_request(f"r{i}", f"prompt number {i} with a few words more", params, envelope())
    engine.step()
    assert pool("used") == engine.kv_stats().num_used_blocks > 0
    for i in range(2):
        engine.abort_request(f"r{i}")
    assert not engine.has_unfinished_requests()
    stats = engine.kv_stats()
    assert stats.num_used_blocks == 0
    assert (pool("used"), pool("free"), pool("cached")) == (0, stats.num_free_blocks, stats.num_cached_blocks)
    assert pool("free") + pool("cached") == 24


def test_prefix_hit_ratio_is_over_each_scopes_recent_requests(tiny_dir, make_engine, monkeypatch) -> None:
    monkeypatch.setattr(telemetry, "HIT_RATIO_WINDOW", 2)
    sink, metrics = ListSink(), PrometheusSink()
    engine = make_engine(model=str(tiny_dir))
    engine.sinks += [sink, metrics]
    params = SamplingParams(max_tokens=2, temperature=0, ignore_eos=True)
    prompt = "a shared system prompt that is long enough to fill a few blocks of the cache " * 3

    def ratio(scope: str) -> float | None:
        return metrics.registry.get_sample_value("tenantgate_prefix_cache_hit_ratio", {"scope": scope})

    engine.generate([prompt], params, envelope("acme-corp", scope="tenant"))
    assert ratio("tenant") == 0 and ratio("shared") is None  # a scope appears with its first request
    for _ in range(2):
        engine.generate([prompt], params, envelope("acme-corp", scope="tenant"))
    first, second, third = sink.requests
    assert first.cached_tokens == 0 and second.cached_tokens > 0
    # The first request (no hits) has left the window of two.
    assert ratio("tenant") == ((second.cached_tokens + third.cached_tokens)
                               / (second.prompt_tokens + third.prompt_tokens))
