"""When a finished request's record is written: at once when its engine keeps no x-records or
already has the request's, after the engine's record otherwise; a record the trail refuses
fails what the caller awaits, whichever way it was written."""

from __future__ import annotations

import asyncio
import gc
import json
from dataclasses import dataclass

import pytest

from gateway.audit.recorder import AuditRecorder
from gateway.audit.trail import AuditTrail
from gateway.errors import AuditUnavailable
from tests.gateway.audit.chains import ListSink, record


@dataclass
class EngineRecord:
    request_id: str
    steps: int


class Backend:
    """An engine whose x-record for a request comes `delay_s` after it is asked for (None: never)."""

    def __init__(self, *, expects_records: bool, delay_s: float | None = None) -> None:
        self.expects_records = expects_records
        self._delay_s = delay_s
        self._since: float | None = None

    def engine_record(self, request_id: str):
        now = asyncio.get_running_loop().time()
        self._since = now if self._since is None else self._since
        if self._delay_s is None or now - self._since < self._delay_s:
            return None
        return EngineRecord(request_id, steps=3)


class FullSink(ListSink):
    def accepts(self, line: str) -> bool:
        return False


def written(sink: ListSink) -> list[dict]:
    return [entry for entry in map(json.loads, sink.lines) if entry["type"] == "record"]


@pytest.fixture
def trail_of(signing_key):
    trails = []

    def make(sink: ListSink) -> AuditRecorder:
        trails.append(AuditTrail([sink], signing_key, checkpoint_interval_s=3600))
        return AuditRecorder(trails[-1], b"k" * 32)

    yield make
    for trail in trails:
        trail.close()


def test_a_backend_that_keeps_no_records_has_its_record_written_at_once(trail_of) -> None:
    sink = ListSink()
    recorder = trail_of(sink)

    async def scenario():
        waiting = recorder.write_after_engine(Backend(expects_records=False), "req-0", record(0))
        return waiting, written(sink)

    waiting, entries = asyncio.run(scenario())
    assert waiting is None  # nothing for the caller to await: no task, no turn of the event loop
    assert [(e["request_id"], "engine" in e) for e in entries] == [("req-0", False)]


def test_an_engine_record_already_in_is_written_with_the_record_at_once(trail_of) -> None:
    sink = ListSink()
    recorder = trail_of(sink)

    async def scenario():
        return recorder.write_after_engine(Backend(expects_records=True, delay_s=0.0), "req-0", record(0))

    assert asyncio.run(scenario()) is None
    assert [e["engine"] for e in written(sink)] == [{"steps": 3}]


def test_an_engine_record_still_to_come_is_waited_for(trail_of) -> None:
    sink = ListSink()
    recorder = trail_of(sink)

    async def scenario():
        waiting = recorder.write_after_engine(Backend(expects_records=True, delay_s=0.05), "req-0", record(0))
        before = written(sink)
        await waiting
        return before

    assert asyncio.run(scenario()) == []  # not written before the engine's record is in
    assert [e["engine"] for e in written(sink)] == [{"steps": 3}]


@pytest.mark.parametrize("delay_s", [None, 0.05], ids=["at once", "after the engine"])
def test_a_record_the_trail_refuses_fails_what_the_caller_awaits(trail_of, delay_s) -> None:
    recorder = trail_of(FullSink())
    backend = Backend(expects_records=delay_s is not None, delay_s=delay_s)

    async def scenario():
        waiting = recorder.write_after_engine(backend, "req-0", record(0))
        assert waiting is not None
        await waiting

    with pytest.raises(AuditUnavailable):
        asyncio.run(scenario())


def test_a_refusal_nobody_awaits_is_no_unhandled_error(trail_of, caplog) -> None:
    recorder = trail_of(FullSink())

    async def scenario():
        recorder.write_after_engine(Backend(expects_records=False), "req-0", record(0))

    asyncio.run(scenario())
    gc.collect()
    assert "exception was never retrieved" not in caplog.text
