import json
import os
import socket
import threading
import time

import pytest

from gateway.audit.trail import AuditTrail, boot_chain_id
from gateway.audit.verify import canonical_json, genesis_digest, line_digest, verify
from tests.gateway.audit.chains import ListSink, build_chain, entries, record


def test_records_are_chained_from_a_genesis_digest(signing_key):
    lines = build_chain(signing_key, 5, chain_id="gw-1")
    chain = entries(lines)
    assert [e["seq"] for e in chain] == list(range(6))
    assert chain[0]["prev"] == genesis_digest("gw-1")
    for before, after in zip(lines[:-2], chain[1:-1]):
        assert after["prev"] == line_digest(before)
    assert all(e["chain"] == "gw-1" for e in chain)


def test_append_returns_the_entry_as_written(signing_key):
    sink = ListSink()
    with AuditTrail([sink], signing_key, chain_id="c") as trail:
        entry = trail.append(record(0))
        assert canonical_json(entry) == sink.lines[0]
        assert entry["seq"] == 0 and entry["type"] == "record" and entry["request_id"] == "req-0"


def test_checkpoints_every_n_records_and_at_close(signing_key):
    sink = ListSink()
    with AuditTrail([sink], signing_key, checkpoint_every=10, checkpoint_interval_s=3600) as trail:
        for i in range(25):
            trail.append(record(i))
        assert [e["seq"] for e in entries(sink.lines) if e["type"] == "checkpoint"] == [10, 21]
        # Durable after the checkpoints: the trail's timer flushes (one flush may cover both).
        deadline = time.monotonic() + 5
        while not sink.flushes and time.monotonic() < deadline:
            time.sleep(0.01)
        flushed = sink.flushes
        assert flushed in (1, 2)
    checkpoints = [e for e in entries(sink.lines) if e["type"] == "checkpoint"]
    assert [(c["seq"], c["count"]) for c in checkpoints] == [(10, 10), (21, 20), (27, 25)]
    assert checkpoints[-1]["head"] == line_digest(sink.lines[-2])
    assert sink.flushes == flushed + 1 and sink.closed  # and at close, after the final checkpoint


def test_close_always_ends_the_chain_with_a_final_checkpoint(signing_key):
    # Even when nothing is unsigned: a record appended after it is then plainly not the writer's.
    lines = build_chain(signing_key, 20, every=10)
    *_, before, last = entries(lines)
    assert (before["type"], before["seq"], "final" in before) == ("checkpoint", 21, False)
    assert (last["type"], last["seq"], last["count"], last["final"], len(lines)) == ("checkpoint", 22, 20, True, 23)
    assert verify(lines, signing_key.public_key()).reason == "intact"


def test_a_quiet_trail_is_signed_within_the_interval(signing_key):
    sink = ListSink()
    with AuditTrail([sink], signing_key, checkpoint_every=1000, checkpoint_interval_s=0.2) as trail:
        trail.append(record(0))
        deadline = time.monotonic() + 5
        while len(sink.lines) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert entries(sink.lines)[-1]["type"] == "checkpoint"


def test_round_trip_verifies(signing_key):
    report = verify(build_chain(signing_key, 250), signing_key.public_key())
    assert report.ok and report.first_bad_seq is None and report.reason == "intact"
    assert (report.records, report.checkpoints, report.chains) == (250, 3, 1)


def test_without_a_signer_the_chain_is_still_verifiable():
    report = verify(build_chain(None, 30), None)
    assert report.ok and report.checkpoints == 0
    assert report.first_bad_seq == 0 and "no checkpoint covers records from seq 0" in report.reason


def test_concurrent_appends_form_one_chain(signing_key):
    sink = ListSink()
    trail = AuditTrail([sink], signing_key, checkpoint_every=50)

    def worker(n: int) -> None:
        for i in range(200):
            trail.append(record(n * 1000 + i))

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    trail.close()
    report = verify(sink.lines, signing_key.public_key())
    assert report.ok and report.reason == "intact" and report.records == 800


def test_values_with_line_breaks_stay_on_one_line(signing_key):
    tricky = "a\nb\rc\r\nd\u2028e\u2029f\x85g\x0bh\x1ci\"j\\k"
    sink = ListSink()
    with AuditTrail([sink], signing_key) as trail:
        trail.append({"outcome": tricky, "nested": {"list": [tricky]}})
    for line in sink.lines:
        assert len(line.splitlines()) == 1 and "\n" not in line and "\r" not in line
    assert json.loads(sink.lines[0])["outcome"] == tricky
    assert verify(sink.lines, signing_key.public_key()).reason == "intact"


@pytest.mark.parametrize("bad", [{"seq": 1}, {"prev": "x"}, {"type": "checkpoint"}, {"chain": "other"}])
def test_records_cannot_set_chain_fields(signing_key, bad):
    with AuditTrail([ListSink()], signing_key) as trail, pytest.raises(ValueError):
        trail.append({"outcome": "ok", **bad})


def test_unserialisable_records_are_refused_without_consuming_a_seq(signing_key):
    with AuditTrail([ListSink()], signing_key) as trail:
        with pytest.raises(ValueError, match="record 0"):
            trail.append({"latency_ms": float("nan")})
        with pytest.raises(ValueError):
            trail.append({"when": object()})
        assert trail.append(record(0))["seq"] == 0


def test_append_after_close_is_refused(signing_key):
    trail = AuditTrail([ListSink()], signing_key)
    trail.close()
    trail.close()
    with pytest.raises(RuntimeError):
        trail.append(record(0))


class BrokenSink(ListSink):
    def write(self, line: str) -> None:
        raise OSError(f"disk full while writing {line}")


def test_a_failing_sink_is_counted_and_logged_without_content(signing_key, caplog):
    good = ListSink()
    with AuditTrail([BrokenSink(), good], signing_key) as trail:
        trail.append({"outcome": "secret-looking-value"})
    assert trail.sink_errors == 2 and len(good.lines) == 2
    assert "seq 0" in caplog.text and "secret-looking-value" not in caplog.text


def test_invalid_settings_are_refused(signing_key):
    with pytest.raises(ValueError):
        AuditTrail([], signing_key, checkpoint_every=0)
    with pytest.raises(ValueError):
        AuditTrail([], signing_key, checkpoint_interval_s=0)


def test_each_boot_gets_a_chain_id_of_its_own(monkeypatch):
    # A restarted container: the same pod name, PID 1 again.
    monkeypatch.setattr(socket, "gethostname", lambda: "gw-0")
    monkeypatch.setattr(os, "getpid", lambda: 1)
    first, second = boot_chain_id(), boot_chain_id()
    assert first != second and first.startswith("gw-0-1-") and second.startswith("gw-0-1-")
    assert boot_chain_id("pod-a").startswith("pod-a-") and len(boot_chain_id("pod-a")) == len("pod-a-") + 8


class OrderedSink(ListSink):
    """Logs what the trail asks of it, into a log its anchor sink shares."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def flush(self) -> None:
        super().flush()
        self.log.append(("durable", len(self.lines)))


class AnchorLog(ListSink):
    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def write(self, line: str) -> None:
        super().write(line)
        self.log.append(("anchor", json.loads(line)["seq"]))


def test_the_chain_is_anchored_at_start_on_the_timer_and_at_close(signing_key):
    log: list = []
    sink, anchors = OrderedSink(log), AnchorLog(log)
    with AuditTrail([sink], signing_key, checkpoint_every=1000, checkpoint_interval_s=0.2, anchors=[anchors]) as trail:
        for i in range(3):
            trail.append(record(i))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and len({a["time"] for a in entries(anchors.lines) if a["seq"] == 4}) < 2:
            time.sleep(0.02)  # the checkpoint at seq 3 is anchored, then again while idle
    found = entries(anchors.lines)
    assert found[0]["seq"] == 0 and found[0]["head"] == genesis_digest(trail.chain_id)
    assert len([a for a in found if a["seq"] == 4]) >= 2, "an idle writer still anchors every interval"
    assert (found[-1]["seq"], found[-1]["final"], sum("final" in a for a in found)) == (len(sink.lines), True, 1)
    assert all(a["chain"] == trail.chain_id for a in found)
    # An anchor never vouches for more than the sinks had made durable.
    durable = 0
    for event, n in log:
        if event == "durable":
            durable = n
        else:
            assert n <= durable
    report = verify(sink.lines, signing_key.public_key(), anchors=anchors.lines, strict=True)
    assert report.ok and report.reason == "intact" and report.anchors == len(found)


def test_anchors_need_a_signer():
    with pytest.raises(ValueError, match="signer"):
        AuditTrail([ListSink()], None, anchors=[ListSink()])
