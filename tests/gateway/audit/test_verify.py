"""Each way of tampering with a chain is caught, at the right seq."""

import json

import pytest

from gateway.audit.verify import canonical_json, line_digest, verify
from tests.gateway.audit.chains import build_chain, edit, entries, index_of, resign

# 250 records, checkpoint_every=100: records 0-99, checkpoint 100, records 101-200,
# checkpoint 201, records 202-251, checkpoint 252 (written at close).


@pytest.fixture(scope="module")
def chain(signing_key):
    return build_chain(signing_key, 250)


def check(lines, key):
    return verify(lines, key.public_key())


def test_an_edited_field_names_the_record(chain, signing_key):
    report = check(edit(chain, 41, outcome="error"), signing_key)
    assert not report.ok and report.first_bad_seq == 41 and report.reason == "record 41 was altered"
    assert report.chain == "chain-a"


def test_an_edited_nested_field_before_a_checkpoint_is_caught_by_its_head(chain, signing_key):
    report = check(edit(chain, 99, usage={"prompt_tokens": 1, "completion_tokens": 1}), signing_key)
    assert (report.ok, report.first_bad_seq, report.reason) == (False, 99, "record 99 was altered")


def test_an_edit_that_breaks_canonical_form_names_the_record(chain, signing_key):
    lines = list(chain)
    lines[41] = lines[41].replace('"outcome":"ok"', '"outcome": "ok"')
    report = check(lines, signing_key)
    assert report.first_bad_seq == 41 and "record 41 was altered" in report.reason


def test_a_duplicated_key_is_an_alteration(chain, signing_key):
    lines = list(chain)
    lines[41] = lines[41].replace('{"chain"', '{"outcome":"denied","chain"', 1)
    assert check(lines, signing_key).first_bad_seq == 41


def test_a_deleted_record_is_reported_missing(chain, signing_key):
    lines = list(chain)
    del lines[index_of(lines, 41)]
    report = check(lines, signing_key)
    assert (report.ok, report.first_bad_seq, report.reason) == (False, 41, "record 41 is missing (deleted)")


def test_several_deleted_records_are_reported_as_a_range(chain, signing_key):
    lines = [line for line in chain if not 41 <= json.loads(line)["seq"] <= 45]
    report = check(lines, signing_key)
    assert (report.first_bad_seq, report.reason) == (41, "records 41-45 are missing (deleted)")


def test_swapped_records_are_reported_out_of_order(chain, signing_key):
    lines = list(chain)
    lines[41], lines[42] = lines[42], lines[41]
    report = check(lines, signing_key)
    assert (report.ok, report.first_bad_seq, report.reason) == (False, 41, "records out of order at seq 41")


def test_a_record_moved_later_is_reported_out_of_order(chain, signing_key):
    lines = list(chain)
    moved = lines.pop(41)
    lines.insert(60, moved)
    assert check(lines, signing_key).reason == "records out of order at seq 41"


def test_a_replayed_record_is_reported_out_of_order(chain, signing_key):
    lines = list(chain)
    lines.insert(43, lines[41])
    assert check(lines, signing_key).first_bad_seq == 41


def test_an_edited_checkpoint_has_an_invalid_signature(chain, signing_key):
    report = check(edit(chain, 100, count=99), signing_key)
    assert (report.ok, report.first_bad_seq) == (False, 100)
    assert report.reason == "checkpoint at seq 100 has an invalid signature"


def test_a_checkpoint_signed_by_another_key_is_refused(chain, signing_key, other_key):
    lines = list(chain)
    i = index_of(lines, 201)
    lines[i] = resign(json.loads(lines[i]), other_key)
    report = check(lines, signing_key)
    assert (report.ok, report.first_bad_seq) == (False, 201)
    assert report.reason == "checkpoint at seq 201 has an invalid signature"


def test_a_forged_checkpoint_with_the_right_key_id_is_refused(chain, signing_key, other_key):
    lines = list(chain)
    i = index_of(lines, 201)
    forged = json.loads(resign(json.loads(lines[i]), other_key))
    lines[i] = canonical_json({**forged, "key_id": json.loads(lines[i])["key_id"]})
    assert check(lines, signing_key).reason == "checkpoint at seq 201 has an invalid signature"


def test_a_record_rewritten_with_a_consistent_chain_is_caught_by_the_next_checkpoint(chain, signing_key):
    # Editing 150 and re-linking every later record still cannot re-sign checkpoint 201.
    lines = edit(chain, 150, outcome="error")
    for seq in range(151, 201):
        i = index_of(lines, seq)
        lines[i] = canonical_json({**json.loads(lines[i]), "prev": line_digest(lines[i - 1])})
    report = check(lines, signing_key)
    assert (report.ok, report.first_bad_seq, report.reason) == (False, 200, "record 200 was altered")


def test_a_deleted_tail_after_a_checkpoint_is_reported_as_unsigned(chain, signing_key):
    lines = [line for line in chain if json.loads(line)["seq"] < 230]
    report = check(lines, signing_key)
    assert report.ok  # the remaining records are intact; only the tail is unsigned
    assert (report.first_bad_seq, report.reason) == (202, "no checkpoint covers records after seq 201")


def test_a_deleted_beginning_is_a_warning_not_tampering(chain, signing_key):
    report = check(chain[index_of(chain, 120):], signing_key)
    assert report.ok and report.first_bad_seq is None
    assert report.warnings == ["chain chain-a starts at seq 120"] and report.records == 131


def test_a_forged_genesis_is_caught(signing_key):
    lines = edit(build_chain(signing_key, 5), 0, prev="0" * 64)
    assert check(lines, signing_key).reason == "record 0 was altered"


def test_a_line_that_is_not_an_entry_is_reported(chain, signing_key):
    lines = list(chain)
    lines.insert(10, "not json")
    report = check(lines, signing_key)
    assert not report.ok and report.reason == "line 11 is not an audit entry"


def test_interleaved_chains_verify_each_on_its_own(signing_key):
    a, b = build_chain(signing_key, 30, every=7, chain_id="a"), build_chain(signing_key, 40, every=9, chain_id="b")
    mixed = [line for pair in zip(a, b) for line in pair] + b[len(a):]
    report = check(mixed, signing_key)
    assert report.ok and report.chains == 2 and report.records == 70 and report.reason == "intact"
    del mixed[next(i for i, e in enumerate(entries(mixed)) if (e["chain"], e["seq"]) == ("b", 12))]
    report = check(mixed, signing_key)
    assert (report.ok, report.chain, report.first_bad_seq) == (False, "b", 12)


def test_rotated_keys_verify_together(signing_key, other_key):
    a, b = build_chain(signing_key, 10, chain_id="a"), build_chain(other_key, 10, chain_id="b")
    assert verify(a + b, [signing_key.public_key(), other_key.public_key()]).reason == "intact"
    assert not verify(a + b, signing_key.public_key()).ok


def test_without_a_key_signatures_are_not_checked(chain):
    report = verify(chain, None)
    assert report.ok and "signatures were not checked" in report.reason
    assert entries(chain)[-1]["type"] == "checkpoint"
