"""Forgery at a chain's end, which a file alone cannot show: anchors (signed heads kept
elsewhere) and `strict` turn each case into a verdict that says what happened.

The chain: records 0-99, checkpoint 100, records 101-200, checkpoint 201, records
202-251, the closing checkpoint 252; anchors at seq 0 (the start) and 253 (the close).
A crashed writer's chain is the same cut at seq 230, with a heartbeat anchor at 220.
"""

import json
import time

import pytest

from gateway.audit.trail import AuditTrail
from gateway.audit.verify import OK, TAMPERED, UNVERIFIED, anchor_genesis_digest, canonical_json, line_digest, verify
from tests.gateway.audit.chains import (
    ListSink,
    anchor_at,
    build_chain,
    edit,
    edit_and_relink,
    entries,
    forge,
    record,
    resign,
)


@pytest.fixture(scope="module")
def closed(signing_key):
    anchors = ListSink()
    lines = build_chain(signing_key, 250, anchors=anchors)
    return lines, anchors.lines


@pytest.fixture(scope="module")
def crashed(closed, signing_key):
    """A writer killed at seq 230; its timer last anchored the chain at seq 220."""
    lines, anchors = closed
    lines = [line for line in lines if json.loads(line)["seq"] < 230]
    return lines, anchors[:1] + [anchor_at(lines, 220, signing_key)]


def check(lines, key, anchors=None, **options):
    return verify(lines, key.public_key(), anchors=anchors, **options)


def test_the_trail_anchors_its_start_and_its_close(closed, signing_key):
    lines, anchors = closed
    assert [(a["seq"], a.get("final", False)) for a in entries(anchors)] == [(0, False), (253, True)]
    report = check(lines, signing_key, anchors, strict=True)
    assert (report.verdict, report.reason, report.anchors) == (OK, "intact", 2)


@pytest.mark.parametrize("anchored", [False, True])
def test_records_appended_after_the_close_are_tampering(closed, signing_key, anchored):
    lines, anchors = closed
    report = check(lines + forge(3, after=lines[-1]), signing_key, anchors if anchored else None)
    assert (report.verdict, report.first_bad_seq) == (TAMPERED, 253)
    assert report.reason == "record 253 follows the chain's closing checkpoint (written after its writer shut down)"


def test_a_deleted_closing_checkpoint_is_tampering_against_the_anchors(closed, signing_key):
    lines, anchors = closed
    report = check(lines[:-1], signing_key, anchors)
    assert (report.verdict, report.first_bad_seq) == (TAMPERED, 252)
    assert report.reason == ("the closing checkpoint at seq 252 is missing (deleted): "
                             "an anchor vouches for the chain through seq 252")


def test_without_anchors_a_deleted_closing_checkpoint_is_only_unverified(closed, signing_key):
    lines, _ = closed
    assert check(lines[:-1], signing_key).verdict == OK  # it looks like a crash
    report = check(lines[:-1], signing_key, strict=True)
    assert (report.verdict, report.first_bad_seq) == (UNVERIFIED, 202)
    assert report.reason.startswith("records 202-251 are signed by no checkpoint and carry no time: appended by")


def test_forged_records_in_place_of_the_closing_checkpoint_differ_from_the_anchor(closed, signing_key):
    lines, anchors = closed
    forged = lines[:-1] + forge(4, after=lines[-2])
    report = check(forged, signing_key, anchors)
    assert (report.verdict, report.first_bad_seq) == (TAMPERED, 202)
    assert report.reason == "entries 202-252 differ from the anchor for seq 253 (altered or replaced)"


def test_a_tail_deleted_back_past_a_heartbeat_anchor_is_tampering(crashed, signing_key):
    lines, anchors = crashed
    report = check([line for line in lines if json.loads(line)["seq"] < 210], signing_key, anchors)
    assert (report.verdict, report.first_bad_seq) == (TAMPERED, 210)
    assert report.reason == "entries 210-219 are missing (deleted): an anchor vouches for the chain through seq 219"


def test_an_edited_unsigned_tail_is_caught_by_a_heartbeat_anchor(crashed, signing_key):
    lines, anchors = crashed
    report = check(edit_and_relink(lines, 210, outcome="error"), signing_key, anchors)
    assert (report.verdict, report.first_bad_seq) == (TAMPERED, 202)
    assert report.reason == "entries 202-219 differ from the anchor for seq 220 (altered or replaced)"


def test_a_crashed_writers_tail_is_unverified_once_its_writer_is_gone(crashed, signing_key):
    lines, anchors = crashed
    report = check(lines, signing_key, anchors, strict=True)  # anchored just now: the writer may sign it yet
    assert (report.verdict, report.warnings[0]) == (OK, "no checkpoint or anchor covers records after seq 219")
    report = check(lines, signing_key, anchors, strict=True, now=time.time() + 120)
    assert (report.verdict, report.first_bad_seq) == (UNVERIFIED, 220)
    assert report.reason.startswith("records 220-229 are signed by no checkpoint or anchor, and the chain's last "
                                    "anchor is 120 s old (its writer stopped): appended by someone without the "
                                    "signing key, or left unsigned by a writer that crashed")


def test_an_edited_tail_beyond_the_last_anchor_is_unverified(crashed, signing_key):
    lines, anchors = crashed
    report = check(edit_and_relink(lines, 225, outcome="error"), signing_key, anchors, strict=True,
                   now=time.time() + 120)
    assert (report.verdict, report.first_bad_seq) == (UNVERIFIED, 220)


@pytest.mark.parametrize("anchored", [False, True])
def test_an_injected_chain_is_unverified(closed, signing_key, anchored):
    lines, anchors = closed
    injected = lines + forge(20, chain_id="gw-0-1-deadbeef")
    loose = check(injected, signing_key, anchors if anchored else None)
    assert loose.verdict == OK and loose.reason.endswith("covers records from seq 0")
    report = check(injected, signing_key, anchors if anchored else None, strict=True)
    assert (report.verdict, report.chain, report.first_bad_seq) == (UNVERIFIED, "gw-0-1-deadbeef", 0)
    assert report.reason == ("the chain has no anchor (injected, or its writer never reached the anchor store)"
                             if anchored else "the chain has no checkpoint: nothing in it is signed "
                                              "(injected, or its writer crashed before signing)")


def test_an_injected_chain_with_a_checkpoint_of_another_key_is_tampering(closed, signing_key, other_key):
    lines, anchors = closed
    chain = forge(5, chain_id="intruder")
    checkpoint = {"type": "checkpoint", "chain": "intruder", "seq": 5, "head": json.loads(forge(6, chain_id="x")[0])[
        "prev"], "count": 5, "time": time.time(), "final": True}
    report = check(lines + chain + [resign(checkpoint, other_key)], signing_key, anchors, strict=True)
    assert (report.verdict, report.reason) == (TAMPERED, "checkpoint at seq 5 has an invalid signature")


def test_a_forged_or_altered_anchor_is_tampering(closed, signing_key, other_key):
    lines, anchors = closed
    forged = anchor_at(lines + forge(3, after=lines[-1]), 256, other_key)
    report = check(lines, signing_key, anchors + [forged])
    assert (report.verdict, report.first_bad_seq) == (TAMPERED, 256)
    assert report.reason == "the anchor for seq 256 has an invalid signature (forged or altered)"
    altered = canonical_json({**json.loads(anchors[-1]), "seq": 300})
    assert check(lines, signing_key, anchors[:-1] + [altered]).verdict == TAMPERED


def test_an_unreadable_anchor_is_skipped_with_a_warning(closed, signing_key):
    lines, anchors = closed
    report = check(lines, signing_key, anchors + ["not an anchor", lines[0]])
    assert report.verdict == OK
    assert report.warnings == ["anchor 3 is not a readable anchor (skipped)",
                               "anchor 4 is not a readable anchor (skipped)"]


def test_without_anchors_the_tails_age_comes_from_its_records(signing_key):
    sink = ListSink()
    trail = AuditTrail([sink], signing_key, checkpoint_every=5, checkpoint_interval_s=3600, chain_id="c")
    for i in range(8):
        trail.append({**record(i), "time": round(time.time() - 30, 3)})
    lines = list(sink.lines)  # the writer dies here: records 6-8 unsigned
    trail.close()
    assert check(lines, signing_key, strict=True, max_unsigned_age_s=60).verdict == OK
    report = check(lines, signing_key, strict=True, max_unsigned_age_s=10)
    assert (report.verdict, report.first_bad_seq) == (UNVERIFIED, 6)
    assert report.reason.startswith("records 6-8 are signed by no checkpoint and 30 s old: appended by")


def test_a_chain_with_no_checkpoint_is_unverified(signing_key):
    lines = build_chain(None, 10)
    assert check(lines, signing_key).verdict == OK
    assert check(lines, signing_key, strict=True).verdict == UNVERIFIED


def test_anchors_need_a_public_key(closed):
    lines, anchors = closed
    with pytest.raises(ValueError, match="public key"):
        verify(lines, None, anchors=anchors)


def test_a_healthy_record_edit_is_still_named_with_anchors(closed, signing_key):
    lines, anchors = closed
    report = check(edit(lines, 41, outcome="error"), signing_key, anchors, strict=True)
    assert (report.verdict, report.first_bad_seq, report.reason) == (TAMPERED, 41, "record 41 was altered")


def _dated(lines: list[str], at: float) -> list[str]:
    """Forged records appended to `lines`, each dated `at`, linked as the writer links them."""
    forged = lines + forge(3, after=lines[-1])
    for seq in range(len(lines), len(forged)):
        forged = edit_and_relink(forged, seq, time=at)
    return forged


def test_a_tail_dated_in_the_future_is_unverified(signing_key):
    # A chain signed to its end (its writer crashed after a checkpoint); a forger appends records
    # dated 30 years ahead. On main they passed --strict as a live writer's fresh tail, for 30 years.
    sink = ListSink()
    trail = AuditTrail([sink], signing_key, checkpoint_every=5, checkpoint_interval_s=3600, chain_id="c")
    for i in range(5):
        trail.append({**record(i), "time": round(time.time(), 3)})
    lines = list(sink.lines)
    trail.close()
    report = check(_dated(lines, round(time.time() + 30 * 365 * 86400, 3)), signing_key, strict=True)
    assert (report.verdict, report.first_bad_seq) == (UNVERIFIED, 6)
    assert report.reason.startswith("records 6-8 are signed by no checkpoint and dated 946080000 s in the future: "
                                    "appended by someone without the signing key")
    # A writer's clock a little ahead of the verifier's is no forgery.
    assert check(_dated(lines, round(time.time() + 2, 3)), signing_key, strict=True).verdict == OK


@pytest.fixture(scope="module")
def heartbeats(signing_key):
    """A writer whose timer anchored every checkpoint: records 0-4, checkpoint 5 (anchored at 6),
    records 6-10, checkpoint 11 (anchored at 12), records 12-15, checkpoint 16 (anchored at 17),
    then the closing checkpoint 17 and anchor 18; idle heartbeats anchor seqs again in between."""
    sink, anchors = ListSink(), ListSink()
    with AuditTrail([sink], signing_key, checkpoint_every=5, checkpoint_interval_s=0.2, chain_id="gw",
                    anchors=[anchors]) as trail:
        for first, count, anchored in ((0, 5, 6), (5, 5, 12), (10, 4, 17)):
            for i in range(first, first + count):
                trail.append(record(i))
            deadline = time.monotonic() + 10
            while anchored not in {a["seq"] for a in entries(anchors.lines)} and time.monotonic() < deadline:
                time.sleep(0.02)
    assert [e["seq"] for e in entries(sink.lines) if e["type"] == "checkpoint"] == [5, 11, 16, 17]
    assert {0, 6, 12, 17, 18} <= {a["seq"] for a in entries(anchors.lines)}
    return sink.lines, anchors.lines


def test_anchors_are_numbered_and_chained(heartbeats, signing_key):
    lines, anchors = heartbeats
    found = entries(anchors)
    assert [a["number"] for a in found] == list(range(len(found)))
    assert found[0]["prev"] == anchor_genesis_digest("gw")
    assert all(after["prev"] == line_digest(before) for before, after in zip(anchors, found[1:]))
    report = check(lines, signing_key, anchors + anchors, strict=True)  # two stores holding the same anchors
    assert (report.verdict, report.reason) == (OK, "intact")


def _cut(heartbeats, *, through_seq: int):
    """What an attacker with write access to the trail and the anchor store leaves: the chain up to
    the entry at `through_seq` (a checkpoint), and only the anchors that vouch for no more."""
    lines, anchors = heartbeats
    return ([line for line in lines if json.loads(line)["seq"] <= through_seq],
            [a for a in anchors if json.loads(a)["seq"] <= through_seq + 1])


def test_a_chain_cut_back_to_a_checkpoint_with_the_newer_anchors_is_unverified_never_ok(heartbeats, signing_key):
    # Records 12-15 were acknowledged; on main this cut passed --strict --anchors as ok.
    lines, anchors = _cut(heartbeats, through_seq=11)
    later = time.time() + 120  # the writer has long stopped anchoring (a live one anchors every interval)
    report = check(lines, signing_key, anchors, strict=True, now=later)
    assert (report.verdict, report.first_bad_seq) == (UNVERIFIED, 12)
    assert report.reason == ("the chain ends at seq 11 with no closing anchor, and its last anchor is 120 s old: its "
                             "writer crashed, or its end was cut together with the anchors after it")
    assert "chain gw has no closing anchor" in check(lines, signing_key, anchors, now=later).warnings
    # Judged while a live writer could still be about to anchor, the same cut only waits.
    assert check(lines, signing_key, anchors, strict=True).verdict == OK


def test_an_anchor_that_another_copy_kept_makes_the_cut_tampering(heartbeats, signing_key):
    # The bound: what an anchor outside the attacker's reach vouches for cannot go unnoticed.
    lines, anchors = _cut(heartbeats, through_seq=11)
    witness = [a for a in heartbeats[1] if json.loads(a)["seq"] == 17]
    report = check(lines, signing_key, anchors + witness, strict=True)
    kept, seen = entries(anchors)[-1]["number"], json.loads(witness[0])["number"]
    assert report.verdict == TAMPERED
    if seen == kept + 1:  # no idle heartbeat between: the witness's anchor vouches for the entries cut
        assert report.reason == "entries 12-16 are missing (deleted): an anchor vouches for the chain through seq 16"
    else:  # and the anchors between are a gap in the store
        assert report.reason.endswith(f"missing from the anchor store (deleted): anchor {seen} follows anchor {kept}")


def test_an_anchor_deleted_while_a_later_one_remains_is_tampering(heartbeats, signing_key):
    lines, anchors = heartbeats
    kept = [a for a in anchors if json.loads(a)["seq"] != 6]
    gone = [a["number"] for a in entries(anchors) if a["seq"] == 6]
    report = check(lines, signing_key, kept)
    assert (report.verdict, report.first_bad_seq) == (TAMPERED, 0)
    missing = f"anchor {gone[0]} is" if len(gone) == 1 else f"anchors {gone[0]}-{gone[-1]} are"
    assert report.reason == (f"{missing} missing from the anchor store (deleted): anchor {gone[-1] + 1} follows "
                             f"anchor {gone[0] - 1}")


def test_two_signed_anchors_with_one_number_are_tampering(heartbeats, signing_key):
    lines, anchors = heartbeats
    other = resign({**json.loads(anchors[2]), "time": time.time()}, signing_key)
    report = check(lines, signing_key, anchors + [other])
    assert (report.verdict, report.reason) == (TAMPERED, "two anchors numbered 2 disagree")
