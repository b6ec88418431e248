"""The Redis Stream sink against a real redis-server: delivery, outages, read-back."""

import os
import signal
import statistics
import time

import pytest

from devkit.server import free_port
from gateway.audit.sinks import RedisStreamSink, SinkStalled, read_stream
from gateway.audit.trail import AuditRefused, AuditTrail
from gateway.audit.verify import verify
from tests.gateway.audit.chains import record


def wait_for(condition, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def append_timed(trail: AuditTrail, start: int, count: int) -> list[float]:
    latencies = []
    for i in range(start, start + count):
        began = time.perf_counter()
        trail.append(record(i))
        latencies.append(time.perf_counter() - began)
    return latencies


def test_entries_reach_the_stream_and_verify(redis_server, signing_key):
    client = redis_server.client()
    sink = RedisStreamSink(client, stream="audit:test")
    with AuditTrail([sink], signing_key, checkpoint_every=100) as trail:
        append_timed(trail, 0, 1000)
    assert sink.dropped == 0 and sink.pending == 0 and sink.healthy
    assert client.xlen("audit:test") == 1011  # a checkpoint every 100 records, and the closing one
    report = verify(read_stream(client, "audit:test", batch=300), signing_key.public_key())
    assert report.ok and report.reason == "intact" and (report.records, report.checkpoints) == (1000, 11)
    client.close()


def test_an_outage_does_not_block_appends_and_loses_nothing_within_the_buffer(redis_server, signing_key):
    client = redis_server.client()
    sink = RedisStreamSink(client, stream="audit:test", buffer_size=5000, retry_max_s=0.2)
    trail = AuditTrail([sink], signing_key, checkpoint_every=100)
    append_timed(trail, 0, 300)
    assert sink.drain(10)

    redis_server.stop(save=True)
    latencies = append_timed(trail, 300, 1000)
    assert wait_for(lambda: not sink.healthy)
    assert max(latencies) < 0.1 and statistics.median(latencies) < 0.005
    assert sink.pending > 1000 - sink.batch_size

    redis_server.start()
    assert sink.drain(20) and sink.healthy and sink.dropped == 0
    trail.close()
    report = verify(read_stream(client, "audit:test"), signing_key.public_key())
    assert report.ok and report.reason == "intact" and report.records == 1300
    client.close()


def test_a_hung_redis_does_not_block_appends(redis_server, signing_key):
    client = redis_server.client(socket_timeout=0.5)
    sink = RedisStreamSink(client, stream="audit:test", retry_max_s=0.2)
    trail = AuditTrail([sink], signing_key, checkpoint_every=50)
    os.kill(redis_server.process.pid, signal.SIGSTOP)
    try:
        latencies = append_timed(trail, 0, 300)
        assert max(latencies) < 0.1
        assert wait_for(lambda: not sink.healthy)
    finally:
        os.kill(redis_server.process.pid, signal.SIGCONT)
    assert sink.drain(20) and sink.dropped == 0
    trail.close()
    assert verify(read_stream(client, "audit:test"), signing_key.public_key()).reason == "intact"
    client.close()


def test_a_full_queue_refuses_more_and_only_close_drops_what_is_left(redis_server, signing_key):
    unreachable = redis_server.client(port=free_port())
    sink = RedisStreamSink(unreachable, buffer_size=10, retry_max_s=0.05)
    for i in range(10):
        sink.write(f'{{"n":{i}}}')
    assert sink.stalled and not sink.accepts('{"n":10}') and sink.held == 10
    with pytest.raises(SinkStalled):
        sink.write('{"n":10}')
    assert sink.dropped == 0 and sink.pending == 10
    assert wait_for(lambda: not sink.healthy)
    sink.close(timeout=0.1)
    assert sink.dropped == 10 and sink.pending == 0
    unreachable.close()


def test_records_beyond_the_queue_are_refused_without_a_seq_and_the_stream_stays_whole(redis_server, signing_key):
    # On main the sink dropped them: the trail gave them seqs, and the central copy read as TAMPERED.
    client = redis_server.client()
    sink = RedisStreamSink(client, stream="audit:test", buffer_size=50, retry_max_s=0.05)
    trail = AuditTrail([sink], signing_key, checkpoint_every=1000, checkpoint_interval_s=3600)
    redis_server.stop(save=True)
    kept = []
    for i in range(80):
        try:
            kept.append(trail.append(record(i))["seq"])
        except AuditRefused:
            pass
    assert kept == list(range(50)) and trail.refused == 30 and trail.seq == 50 and not trail.accepting
    redis_server.start()
    assert wait_for(lambda: trail.accepting) and sink.drain(10)
    assert trail.append(record(80))["seq"] == 50
    trail.close()
    assert sink.dropped == 0
    report = verify(read_stream(client, "audit:test"), signing_key.public_key())
    assert (report.reason, report.records) == ("intact", 51)
    client.close()


def test_a_gap_in_the_central_copy_is_reported(redis_server, signing_key):
    client = redis_server.client()
    sink = RedisStreamSink(client, stream="audit:test")
    with AuditTrail([sink], signing_key, checkpoint_every=10) as trail:
        append_timed(trail, 0, 30)
    victim = client.xrange("audit:test", count=6)[-1][0]
    client.xdel("audit:test", victim)
    report = verify(read_stream(client, "audit:test"), signing_key.public_key())
    assert (report.ok, report.first_bad_seq, report.reason) == (False, 5, "record 5 is missing (deleted)")
    client.close()


def test_read_stream_skips_an_exact_repeat_of_a_recent_entry(redis_server, signing_key):
    client = redis_server.client(decode_responses=True)
    with AuditTrail([sink := RedisStreamSink(client, stream="s")], signing_key, checkpoint_every=5) as trail:
        append_timed(trail, 0, 12)
    lines = list(read_stream(client, "s"))
    for line in lines[8:11]:  # as if an EXEC reply was lost and the batch sent again
        client.xadd("s", {"entry": line})
    assert list(read_stream(client, "s")) == lines and sink.dropped == 0
    assert verify(read_stream(client, "s"), signing_key.public_key()).reason == "intact"
    client.close()
