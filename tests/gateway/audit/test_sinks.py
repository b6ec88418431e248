import hashlib
import io
import json
import os
import stat
import threading
import time

import pytest

from gateway.audit.sinks import RedisStreamSink, RotatingFileSink, StreamSink, rotated_files, trail_files, worker_file
from gateway.audit.trail import AuditSink, AuditTrail
from gateway.audit.verify import verify, verify_files
from tests.gateway.audit.chains import cut_mid_line, forge, record
from tests.utils.protocols import protocol_members


def write_rotating(tmp_path, key, records, *, max_bytes=20_000, backup_count=50, every=25):
    sink = RotatingFileSink(tmp_path / "audit.jsonl", max_bytes=max_bytes, backup_count=backup_count)
    with AuditTrail([sink], key, checkpoint_every=every, chain_id="gw") as trail:
        for i in range(records):
            trail.append(record(i))
    return rotated_files(tmp_path / "audit.jsonl")


def test_every_sink_has_every_member_the_protocol_declares(tmp_path, redis_server):
    # The trail reads them directly (a file sink's repairs at start): a sink missing one fails here.
    declared = protocol_members(AuditSink)
    assert {"repairs", "write", "flush", "close"} <= declared
    client = redis_server.client()
    sinks = [StreamSink(io.StringIO()), RotatingFileSink(tmp_path / "audit.jsonl"), RedisStreamSink(client)]
    try:
        for sink in sinks:
            assert all(hasattr(sink, name) for name in declared), type(sink).__name__
            assert list(sink.repairs) == []  # nothing torn to end in a new stream, file or Redis stream
    finally:
        for sink in sinks:
            sink.close()
        client.close()


def test_stream_sink_writes_json_lines():
    out = io.StringIO()
    sink = StreamSink(out)
    sink.write('{"a":1}')
    sink.close()
    assert out.getvalue() == '{"a":1}\n'


def test_stream_sink_defaults_to_stdout(capsys, signing_key):
    with AuditTrail([StreamSink()], signing_key) as trail:
        trail.append(record(0))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and verify(lines, signing_key.public_key()).reason == "intact"


def test_rotation_keeps_files_under_the_size_and_verifies_as_one_chain(tmp_path, signing_key):
    files = write_rotating(tmp_path, signing_key, 400)
    assert len(files) > 3
    assert files[-1].name == "audit.jsonl" and files[0].name == f"audit.jsonl.{len(files) - 1}"
    assert all(f.stat().st_size <= 20_000 for f in files)
    report = verify_files(files, signing_key.public_key())
    assert report.ok and report.reason == "intact" and report.records == 400


def test_rotated_files_given_in_the_wrong_order_are_not_one_chain(tmp_path, signing_key):
    files = write_rotating(tmp_path, signing_key, 400)
    report = verify_files(list(reversed(files)), signing_key.public_key())
    assert not report.ok


def test_a_file_beginning_mid_chain_verifies_from_its_first_entry(tmp_path, signing_key):
    files = write_rotating(tmp_path, signing_key, 400)
    first_seq = json.loads(files[1].read_text().splitlines()[0])["seq"]
    report = verify_files(files[1:], signing_key.public_key())
    assert report.ok and report.first_bad_seq is None
    assert report.warnings == [f"chain gw starts at seq {first_seq}"]
    # A middle file alone: its end is signed only by a checkpoint in the next file.
    one = verify_files([files[-2]], signing_key.public_key())
    assert one.ok and one.warnings[0].startswith("no checkpoint covers records after seq")
    assert one.warnings[1].startswith("chain gw starts at seq")


def test_a_record_deleted_inside_a_rotated_file_is_tampering(tmp_path, signing_key):
    files = write_rotating(tmp_path, signing_key, 400)
    lines = files[1].read_text().splitlines(keepends=True)
    gone = json.loads(lines[5])["seq"]
    files[1].write_text("".join(lines[:5] + lines[6:]))
    report = verify_files(files, signing_key.public_key())
    assert (report.ok, report.first_bad_seq) == (False, gone)
    assert report.reason == f"record {gone} is missing (deleted)"  # said of a checkpoint too: its kind is gone with it


def test_a_broken_line_names_its_file_and_line(tmp_path, signing_key):
    files = write_rotating(tmp_path, signing_key, 100)
    with open(files[0], "ab") as file:
        file.write(b"\xff\xfe not utf-8\n")
    report = verify_files(files, signing_key.public_key())
    assert not report.ok
    assert report.reason.startswith(f"{files[0]}:") and report.reason.endswith("is not an audit entry")


def test_the_file_sink_appends_across_restarts_as_separate_chains(tmp_path, signing_key):
    path = tmp_path / "audit.jsonl"
    for chain_id in ("first-run", "second-run"):
        with AuditTrail([RotatingFileSink(path)], signing_key, chain_id=chain_id) as trail:
            for i in range(10):
                trail.append(record(i))
    report = verify_files([path], signing_key.public_key())
    assert report.ok and report.chains == 2 and report.records == 20 and report.reason == "intact"


def test_the_file_is_not_world_readable_and_fsyncs_after_checkpoints_on_the_trails_thread(
        tmp_path, signing_key, monkeypatch):
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(threading.current_thread().name), real_fsync(fd)))
    path = tmp_path / "audit.jsonl"
    # A long interval: the timer wakes for the checkpoints, not on its own.
    with AuditTrail([RotatingFileSink(path)], signing_key, checkpoint_every=10, checkpoint_interval_s=600) as trail:
        for i in range(10):
            trail.append(record(i))
        deadline = time.monotonic() + 5
        while not synced and time.monotonic() < deadline:
            time.sleep(0.01)
        # Synced once the checkpoint was written, and never on the thread that appends (the event loop).
        assert synced and set(synced) == {"audit-checkpoint"}
    assert stat.S_IMODE(path.stat().st_mode) & 0o007 == 0


def test_a_slow_disk_does_not_hold_up_appends(tmp_path, signing_key, monkeypatch):
    # An fsync that takes 300 ms (a busy disk): every append still returns at once, and the
    # entries are still made durable, on the trail's thread, and the chain verifies.
    real_fsync = os.fsync
    syncing = threading.Event()

    def slow_fsync(fd: int) -> None:
        syncing.set()
        time.sleep(0.3)
        real_fsync(fd)

    path = tmp_path / "audit.jsonl"
    with AuditTrail([RotatingFileSink(path)], signing_key, checkpoint_every=5, checkpoint_interval_s=600) as trail:
        monkeypatch.setattr(os, "fsync", slow_fsync)
        slowest = 0.0
        for i in range(40):
            started = time.perf_counter()
            trail.append(record(i))
            slowest = max(slowest, time.perf_counter() - started)
            if i == 5:
                assert syncing.wait(5)  # a sync is under way from here on
        assert slowest < 0.1, f"an append waited {slowest:.3f} s for the disk"
    monkeypatch.setattr(os, "fsync", real_fsync)
    report = verify_files([path], signing_key.public_key())
    assert report.ok and report.records == 40


def test_rotated_files_orders_backups_numerically(tmp_path):
    for name in ("a.log", "a.log.1", "a.log.2", "a.log.10", "a.log.bak", "b.log.3"):
        (tmp_path / name).write_text("")
    assert [p.name for p in rotated_files(tmp_path / "a.log")] == ["a.log.10", "a.log.2", "a.log.1", "a.log"]


def test_a_trail_is_its_own_rotated_files_then_each_workers_in_worker_order(tmp_path):
    assert worker_file(tmp_path / "a.log", 3) == tmp_path / "a.log.worker-3"
    for name in ("a.log", "a.log.1", "a.log.worker-10", "a.log.worker-2", "a.log.worker-2.1", "a.log.worker-x",
                 "a.log.worker-2.bak", "b.log.worker-1"):
        (tmp_path / name).write_text("")
    assert [p.name for p in trail_files(tmp_path / "a.log")] == [
        "a.log.1", "a.log", "a.log.worker-2.1", "a.log.worker-2", "a.log.worker-10"]
    (tmp_path / "a.log").unlink()
    (tmp_path / "a.log.1").unlink()
    assert trail_files(tmp_path / "a.log")[0].name == "a.log.worker-2.1"  # workers only: `serve --workers`


def test_invalid_rotation_settings_are_refused(tmp_path):
    with pytest.raises(ValueError):
        RotatingFileSink(tmp_path / "x", max_bytes=0)
    with pytest.raises(ValueError):
        RotatingFileSink(tmp_path / "x", backup_count=0)


def test_a_torn_last_line_is_reported_as_torn(tmp_path, signing_key):
    path = write_rotating(tmp_path, signing_key, 30, max_bytes=1 << 20)[-1]
    cut_mid_line(path)
    report = verify_files([path], signing_key.public_key())
    assert report.ok and report.first_bad_seq == 26  # the closing checkpoint was the torn entry
    assert report.warnings[1] == (f"{path}:32 is a torn last entry "
                                  "(40 bytes without a newline: its writer stopped mid-write)")


def test_a_torn_last_line_is_ended_on_open_and_the_repair_recorded(tmp_path, signing_key, caplog):
    path = write_rotating(tmp_path, signing_key, 30, max_bytes=1 << 20)[-1]
    torn = cut_mid_line(path)
    with AuditTrail([RotatingFileSink(path)], signing_key, chain_id="next-boot") as trail:
        trail.append(record(0))
    lines = path.read_bytes().split(b"\n")
    assert lines[31] == torn  # the fragment stays, on a line of its own
    repair = json.loads(lines[32])
    assert (repair["chain"], repair["seq"], repair["event"]) == ("next-boot", 0, "audit.torn_line_ended")
    assert (repair["torn_bytes"], repair["torn_sha256"]) == (40, hashlib.sha256(torn).hexdigest())
    report = verify_files([path], signing_key.public_key())
    assert report.ok and report.chains == 2
    assert f"{path}:32 is a torn entry (40 bytes; its writer stopped mid-write): chain next-boot ended the line " \
           "when it started" in report.warnings
    assert "ended in part of a line (40 bytes)" in caplog.text and torn.decode() not in caplog.text


def test_a_bad_line_that_no_repair_names_is_still_tampering(tmp_path, signing_key):
    path = write_rotating(tmp_path, signing_key, 30, max_bytes=1 << 20)[-1]
    cut_mid_line(path)
    with open(path, "ab") as file:
        file.write(b"\n" + forge(1, chain_id="someone")[0].encode() + b"\n")
    report = verify_files([path], signing_key.public_key())
    assert not report.ok and report.reason == f"{path}:32 is not an audit entry"
