from __future__ import annotations

import asyncio

import pytest

from engine.async_engine import AsyncLLMEngine
from engine.llm_engine import RequestError
from engine.sampling_params import SamplingParams
from tests.utils.envelopes import ENV

PROMPT = "Continuous batching lets requests join"


@pytest.fixture
def async_engine(tiny_dir, make_engine):
    engine = AsyncLLMEngine(make_engine(model=str(tiny_dir)))
    yield engine
    engine.shutdown()


async def collect(engine: AsyncLLMEngine, prompt: str, params: SamplingParams, request_id: str | None = None):
    deltas = [d async for d in engine.generate(prompt, params, request_id=request_id, envelope=ENV)]
    return deltas


async def test_streamed_deltas_add_up_to_the_sync_result(async_engine) -> None:
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = async_engine.engine.generate([PROMPT], params, envelopes=ENV)[0]
    deltas = await collect(async_engine, PROMPT, params)
    assert [t for d in deltas for t in d.new_token_ids] == expected.token_ids
    assert "".join(d.new_text for d in deltas) == expected.text
    assert deltas[-1].finished and deltas[-1].finish_reason == "length"
    assert not any(d.finished for d in deltas[:-1])


async def test_concurrent_streams_are_served_together(async_engine) -> None:
    params = [SamplingParams(temperature=0.9, seed=i, max_tokens=12, ignore_eos=True) for i in range(6)]
    expected = async_engine.engine.generate([PROMPT] * 6, params, envelopes=ENV)
    results = await asyncio.gather(*(collect(async_engine, PROMPT, p) for p in params))
    for deltas, exp in zip(results, expected):
        assert [t for d in deltas for t in d.new_token_ids] == exp.token_ids


async def test_leaving_the_stream_aborts_and_frees_blocks(async_engine) -> None:
    stream = async_engine.generate(PROMPT, SamplingParams(max_tokens=400, ignore_eos=True), request_id="gone",
                                   envelope=ENV)
    async for _ in stream:
        assert async_engine.engine.kv_stats().num_used_blocks > 0
        break
    await stream.aclose()  # what a client disconnect does to the handler's generator
    for _ in range(200):
        if async_engine.engine.kv_stats().num_used_blocks == 0 and not async_engine.engine.has_unfinished_requests():
            break
        await asyncio.sleep(0.01)
    assert async_engine.engine.kv_stats().num_used_blocks == 0
    assert not async_engine.engine.has_unfinished_requests()


async def test_cancelled_task_aborts_its_request(async_engine) -> None:
    started = asyncio.Event()

    async def consume():
        async for _ in async_engine.generate(PROMPT, SamplingParams(max_tokens=400, ignore_eos=True), envelope=ENV):
            started.set()

    task = asyncio.create_task(consume())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    for _ in range(200):
        if not async_engine.engine.has_unfinished_requests():
            break
        await asyncio.sleep(0.01)
    assert not async_engine.engine.has_unfinished_requests()


async def test_bad_requests_raise_before_streaming(async_engine) -> None:
    with pytest.raises(RequestError, match="empty"):
        await collect(async_engine, "", SamplingParams())
    # The loop is unharmed.
    deltas = await collect(async_engine, PROMPT, SamplingParams(max_tokens=2, ignore_eos=True))
    assert deltas[-1].finished


async def test_external_abort_ends_the_stream_with_abort(async_engine) -> None:
    deltas = []
    async for delta in async_engine.generate(PROMPT, SamplingParams(max_tokens=400, ignore_eos=True), request_id="x",
                                             envelope=ENV):
        deltas.append(delta)
        if len(deltas) == 1:
            async_engine.abort("x")
    assert deltas[-1].finished and deltas[-1].finish_reason == "abort"
    assert len(deltas) < 400
    assert async_engine.engine.kv_stats().num_used_blocks == 0


async def test_shutdown_ends_open_streams(async_engine) -> None:
    from engine.async_engine import EngineDeadError

    async def consume():
        async for _ in async_engine.generate(PROMPT, SamplingParams(max_tokens=10_000, ignore_eos=True), envelope=ENV):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.2)
    await asyncio.to_thread(async_engine.shutdown)
    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(task, timeout=10)
    with pytest.raises(EngineDeadError):
        await collect(async_engine, PROMPT, SamplingParams(max_tokens=2))


async def test_a_failing_step_reaches_every_waiting_caller(async_engine) -> None:
    from engine.async_engine import EngineDeadError

    def broken_step():
        raise RuntimeError("device lost")

    async_engine.engine.step = broken_step
    with pytest.raises(EngineDeadError):
        await asyncio.wait_for(collect(async_engine, PROMPT, SamplingParams(max_tokens=4)), timeout=10)
    assert not async_engine.is_running


async def test_a_stream_of_n_choices_ends_after_the_last_choice(async_engine) -> None:
    params = SamplingParams(n=3, temperature=1.0, seed=8, max_tokens=6, ignore_eos=True)
    expected = async_engine.engine.generate([PROMPT * 4], params, envelopes=ENV)
    deltas = await collect(async_engine, PROMPT * 4, params)
    for exp in expected:
        assert [t for d in deltas if d.index == exp.index for t in d.new_token_ids] == exp.token_ids
    assert sorted(d.index for d in deltas if d.finished) == [0, 1, 2] and deltas[-1].finished


async def test_leaving_or_aborting_a_stream_of_n_choices_frees_every_choice(async_engine) -> None:
    engine = async_engine.engine
    stream = async_engine.generate(PROMPT * 4, SamplingParams(n=3, max_tokens=400, ignore_eos=True),
                                   request_id="left", envelope=ENV)
    async for _ in stream:
        break
    await stream.aclose()
    for _ in range(200):
        if engine.kv_stats().num_used_blocks == 0 and not engine.has_unfinished_requests():
            break
        await asyncio.sleep(0.01)
    assert engine.kv_stats().num_used_blocks == 0 and not engine.has_unfinished_requests()
    deltas = []
    async for delta in async_engine.generate(PROMPT * 4, SamplingParams(n=2, max_tokens=400, ignore_eos=True),
                                             request_id="x", envelope=ENV):
        deltas.append(delta)
        if len(deltas) == 1:
            async_engine.abort("x")
    aborted = sorted(d.index for d in deltas if d.finished)
    assert aborted == [0, 1] and {d.finish_reason for d in deltas if d.finished} == {"abort"}
    assert engine.kv_stats().num_used_blocks == 0
