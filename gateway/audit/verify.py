"""The audit chain's format, and the verifier that finds the first altered entry.

Every entry is one line of canonical JSON and names its chain (`chain`) and position
(`seq`). A record carries `prev`, the SHA-256 of the previous entry's line; a signed
checkpoint carries the same digest as `head`, with an Ed25519 signature over the rest
of itself. A checkpoint vouches for everything before it, since every entry commits to
the one before; entries after the last checkpoint are only chained, not signed. The
checkpoint written at shutdown says `final`: nothing may follow it.

An anchor is the same signed statement ("before seq N, the chain's head is H") kept
outside the chain, in a second store (a Redis Stream, a file elsewhere): the writer
publishes one when it starts, every checkpoint interval and at shutdown (`final`). Given
anchors, the verifier also finds what a file alone cannot show: entries deleted from the
end, entries appended after the writer stopped, a chain no writer announced. Anchors are
a chain of their own: each is numbered (`number`) and names the previous anchor's digest
(`prev`), so an anchor deleted from the store while a later one remains is a gap. The
newest anchors can still be cut; then the chain has no closing anchor, and once its last
anchor is older than `max_unsigned_age_s` strict calls it unverified (a writer that
crashed, or an end cut with the anchors after it), never ok.

Entries of several chains may interleave (replicas share a Redis stream; a restarted
process starts a new chain in the same file), so the verifier follows each chain on
its own. Problems name seq numbers, never record contents.

Verdicts: "ok" (warnings say what is unsigned, torn or unchecked), "tampered" (an entry
or anchor contradicts a signature or the chain), and, only with `strict`, "unverified":
part of a chain is vouched for by no signature, and the writer cannot still be about to
sign it (an unsigned tail older than `max_unsigned_age_s`, a chain with no checkpoint, a
chain with no anchor).
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from gateway.encoding import canonical_json

RECORD, CHECKPOINT, ANCHOR = "record", "checkpoint", "anchor"
# The record a trail writes first when its file sink found the file ending in part of a
# line (a crash or power loss mid-write) and ended that line: it names the fragment.
TORN_LINE_ENDED = "audit.torn_line_ended"
DEFAULT_MAX_UNSIGNED_AGE_S = 60.0
# How far ahead of the verifier's clock a writer's may be (hosts keep time by NTP): a time
# further ahead is no reason to wait for a writer, only a forged or broken clock.
MAX_CLOCK_SKEW_S = 5.0
RESERVED_FIELDS = frozenset({"type", "chain", "seq", "prev"})


def line_digest(line: str) -> str:
    return hashlib.sha256(line.encode("utf-8")).hexdigest()


def genesis_digest(chain_id: str) -> str:
    """The `prev` of a chain's first entry, so a chain's true beginning can be recognised."""
    return hashlib.sha256(b"tenantgate-audit-genesis:" + chain_id.encode("utf-8")).hexdigest()


def anchor_genesis_digest(chain_id: str) -> str:
    """The `prev` of a chain's first anchor (number 0)."""
    return hashlib.sha256(b"tenantgate-audit-anchor-genesis:" + chain_id.encode("utf-8")).hexdigest()


def key_id(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def load_public_key(pem: bytes) -> Ed25519PublicKey:
    key = serialization.load_pem_public_key(pem)
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError("the audit public key must be an Ed25519 key")
    return key


def signed_body(checkpoint: dict) -> bytes:
    return canonical_json({k: v for k, v in checkpoint.items() if k != "sig"}).encode("utf-8")


def sign(document: dict, signer) -> dict:
    """Adds `sig`, an Ed25519 signature over the rest of the document (a checkpoint or an anchor)."""
    return {**document, "sig": base64.b64encode(signer.sign(signed_body(document))).decode("ascii")}


def _signature_ok(checkpoint: dict, keys: dict[str, Ed25519PublicKey]) -> bool:
    key = keys.get(checkpoint.get("key_id"))  # type: ignore[arg-type]  # an odd key_id finds no key
    if key is None:
        return False
    try:
        key.verify(base64.b64decode(checkpoint["sig"], validate=True), signed_body(checkpoint))
    except (AttributeError, KeyError, TypeError, ValueError, InvalidSignature):
        return False
    return True


def _name(kind: str, seq: int) -> str:
    return f"checkpoint at seq {seq}" if kind == CHECKPOINT else f"record {seq}"


def _span(first: int, last: int, verbs: str, noun: str = "entry") -> str:
    """ "entry 5 is" or "entries 5-7 are": `verbs` is "singular/plural"."""
    one, many = verbs.split("/")
    if first == last:
        return f"{noun} {first} {one}"
    return f"{noun[:-1] + 'ies' if noun.endswith('y') else noun + 's'} {first}-{last} {many}"


def _time_of(entry: dict) -> float:
    value = entry.get("time")
    if type(value) not in (int, float):
        return math.nan
    number = cast(float, value)  # an int or a float, as the test above says
    return float(number) if math.isfinite(number) else math.nan


OK, TAMPERED, UNVERIFIED = "ok", "tampered", "unverified"


@dataclass
class VerifyReport:
    ok: bool  # the verdict is "ok": no tampering, and (strict) nothing left that no signature vouches for
    first_bad_seq: int | None  # the problem's seq, else the first seq nothing signed covers
    reason: str
    records: int
    checkpoints: int
    chains: int = 0
    chain: str | None = None  # the chain first_bad_seq belongs to
    warnings: list[str] = field(default_factory=list)
    verdict: str = OK  # OK, TAMPERED, or (strict only) UNVERIFIED
    anchors: int = 0


@dataclass
class _Chain:
    first_seq: int
    next_seq: int
    head: str
    after_checkpoint: bool = False  # the previous entry was a checkpoint with a good signature
    signed_seq: int | None = None
    count_offset: int | None = None  # checkpoint count minus records seen, once known
    records: int = 0
    failed: bool = False
    gap: tuple[int, int, int] | None = None  # (first missing seq, seq found, position)
    reordered: bool = False
    last_kind: str = RECORD
    closed: bool = False  # its final checkpoint was seen
    anchored_seq: int = -1  # entries before it match an anchor
    tail_time: float | None = None  # the `time` of the first record after the last checkpoint


@dataclass(frozen=True)
class _Link:
    """One numbered anchor, as the anchor chain sees it."""

    digest: str  # of its line
    prev: str  # the digest of the anchor numbered one less
    seq: int


@dataclass
class _Anchored:
    heads: dict[int, str] = field(default_factory=dict)  # seq -> the chain's head before that seq
    links: dict[int, _Link] = field(default_factory=dict)  # number -> the anchor (anchors of old trails have none)
    last_seq: int = 0  # the furthest an anchor vouches for: every entry before it
    last_time: float = -math.inf  # the newest anchor's time: the writer's last sign of life
    final_seq: int | None = None  # the end its closing anchor gave the chain


class _Verifier:
    def __init__(self, public_keys: Sequence[Ed25519PublicKey] | None, anchors: Iterable[str | bytes] | None,
                 strict: bool, max_unsigned_age_s: float, now: float | None) -> None:
        self.keys = None if public_keys is None else {key_id(k): k for k in public_keys}
        self.chains: dict[str, _Chain] = {}
        self.problems: list[tuple[int, str | None, int | None, str]] = []  # (position, chain, seq, reason)
        self.notes: list[str] = []  # warnings found on the way: torn lines, unreadable anchors
        self.records = self.checkpoints = self.anchor_count = 0
        self.position = 0
        self.pending: tuple[int, str, bytes, bool] | None = None  # a line that is no entry, until the next one
        self.strict, self.max_age = strict, max_unsigned_age_s
        self.now = time.time() if now is None else now
        self.anchored: dict[str, _Anchored] | None = None
        if anchors is not None:
            if self.keys is None:
                raise ValueError("anchors can only be checked with a public key")
            self.load_anchors(anchors)

    def fail(self, chain_id: str | None, seq: int | None, reason: str) -> None:
        self.problems.append((self.position, chain_id, seq, reason))
        if chain_id in self.chains:
            self.chains[chain_id].failed = True

    def load_anchors(self, lines: Iterable[str | bytes]) -> None:
        keys = cast("dict[str, Ed25519PublicKey]", self.keys)  # __init__ reads anchors only with keys
        self.anchored = {}
        for number, raw in enumerate(lines, 1):
            try:
                line = (raw.decode("utf-8") if isinstance(raw, bytes) else raw).rstrip("\n")
                anchor = json.loads(line)
                chain_id, seq, head, at = anchor["chain"], anchor["seq"], anchor["head"], anchor["time"]
                valid = anchor["type"] == ANCHOR and isinstance(chain_id, str) and isinstance(head, str)
                valid = valid and type(seq) is int and seq >= 0 and type(at) in (int, float) and math.isfinite(at)
            except (ValueError, TypeError, KeyError, RecursionError):
                valid = False
            if not valid:  # skipping one only takes evidence away, which strict then reports
                self.notes.append(f"anchor {number} is not a readable anchor (skipped)")
                continue
            self.anchor_count += 1
            if canonical_json(anchor) != line or not _signature_ok(anchor, keys):
                self.problems.append((0, chain_id, seq,
                                      f"the anchor for seq {seq} has an invalid signature (forged or altered)"))
                continue
            anchored = self.anchored.setdefault(chain_id, _Anchored())
            if anchored.heads.setdefault(seq, head) != head:
                self.problems.append((0, chain_id, seq, f"two anchors for seq {seq} disagree (a reused chain id)"))
            self._link_anchor(chain_id, anchored, anchor, line_digest(line))
            anchored.last_seq = max(anchored.last_seq, seq)
            anchored.last_time = max(anchored.last_time, at)
            if anchor.get("final") is True:
                anchored.final_seq = seq if anchored.final_seq is None else min(anchored.final_seq, seq)

    def _link_anchor(self, chain_id: str, anchored: _Anchored, anchor: dict, digest: str) -> None:
        number, prev = anchor.get("number"), anchor.get("prev")
        if type(number) is not int or not isinstance(prev, str):
            return  # written before anchors were numbered
        link = anchored.links.setdefault(number, _Link(digest, prev, anchor["seq"]))
        if link.digest != digest:  # the same anchor read from two stores is one
            self.problems.append((0, chain_id, anchor["seq"], f"two anchors numbered {number} disagree"))

    def _anchor_gaps(self) -> list[tuple[int, str | None, int | None, str]]:
        """Anchors deleted from the store while a later one remains, and anchors that do not follow the one before."""
        gaps: list[tuple[int, str | None, int | None, str]] = []
        for chain_id, anchored in (self.anchored or {}).items():
            numbers = sorted(anchored.links)
            for before, after in zip(numbers, numbers[1:]):
                link = anchored.links[before]
                if after != before + 1:
                    missing = _span(before + 1, after - 1, "is/are", "anchor")
                    gaps.append((0, chain_id, link.seq, f"{missing} missing from the anchor store (deleted): "
                                                        f"anchor {after} follows anchor {before}"))
                elif anchored.links[after].prev != link.digest:
                    gaps.append((0, chain_id, link.seq, f"anchor {after} does not follow anchor {before} "
                                                        "(altered or replaced)"))
            first = anchored.links.get(0)
            if first is not None and first.prev != anchor_genesis_digest(chain_id):
                gaps.append((0, chain_id, first.seq,
                             "anchor 0 does not begin the chain's anchors (altered or replaced)"))
        return gaps

    def _stale(self, age: float, old: str = "old") -> str | None:
        """What says no live writer is about to sign entries of this age ("30 s old"); None: one may be."""
        if math.isnan(age):
            return "carry no time"
        if age < -MAX_CLOCK_SKEW_S:  # a time from the future would look fresh forever
            return f"dated {-age:.0f} s in the future"
        return f"{age:.0f} s {old}" if age > self.max_age else None

    def _unclosed(self, chain: _Chain, anchored: _Anchored | None) -> str | None:
        """Why a chain signed to its end may still have lost its end: no closing anchor, and no live writer."""
        if anchored is None or chain.closed or anchored.final_seq is not None:
            return None
        stale = self._stale(self.now - anchored.last_time)
        if stale is None:
            return None
        return (f"the chain ends at seq {chain.next_seq - 1} with no closing anchor, and its last anchor is {stale}: "
                "its writer crashed, or its end was cut together with the anchors after it")

    def feed(self, raw: str | bytes, where: str, terminated: bool = True) -> None:
        self.position += 1
        try:
            line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
            entry = json.loads(line)
            chain_id, seq, kind = entry["chain"], entry["seq"], entry["type"]
            link = entry["prev"] if kind == RECORD else entry["head"]
            valid = isinstance(chain_id, str) and isinstance(link, str) and type(seq) is int and seq >= 0
            valid = valid and kind in (RECORD, CHECKPOINT)
            canonical = canonical_json(entry) == line  # also refuses duplicate keys, spaces, NaN
        except (ValueError, TypeError, KeyError, RecursionError):  # UnicodeDecodeError is a ValueError
            valid = False
        if not valid:
            # Judged at the next line: a torn entry is followed by the record that ended it.
            if self.pending is not None:
                self._not_an_entry()
            data = raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogateescape")
            self.pending = (self.position, where, data, terminated)
            return
        if self.pending is not None:
            self._torn_line_ended(entry)
        self.records += kind == RECORD
        self.checkpoints += kind == CHECKPOINT
        chain = self.chains.get(chain_id)
        if chain is None:
            chain = self.chains[chain_id] = _Chain(seq, seq, link if seq else genesis_digest(chain_id))
            chain.count_offset = 0 if seq == 0 else None
            self._match_anchor(chain_id, chain, kind)
        if chain.failed:
            if chain.gap and chain.gap[0] <= seq < chain.gap[1]:
                chain.reordered = True
            return
        if seq > chain.next_seq:
            chain.gap = (chain.next_seq, seq, self.position)
            chain.failed = True
            return
        if seq < chain.next_seq:
            return self.fail(chain_id, seq, f"records out of order at seq {seq}")
        if chain.closed:
            return self.fail(chain_id, seq, f"{_name(kind, seq)} follows the chain's closing checkpoint "
                                            "(written after its writer shut down)")
        if not canonical:
            return self.fail(chain_id, seq, f"{_name(kind, seq)} was altered (not canonical JSON)")
        if kind == CHECKPOINT:
            if self.keys is not None and not _signature_ok(entry, self.keys):
                return self.fail(chain_id, seq, f"checkpoint at seq {seq} has an invalid signature")
        if link != chain.head:
            # The link or the entry before it changed; a signed neighbour tells which.
            if seq == 0 or chain.after_checkpoint:
                return self.fail(chain_id, seq, f"{_name(kind, seq)} was altered")
            return self.fail(chain_id, seq - 1, f"{_name(chain.last_kind, seq - 1)} was altered")
        if kind == CHECKPOINT:
            count = entry.get("count")
            if chain.count_offset is None and type(count) is int:
                chain.count_offset = count - chain.records
            if type(count) is not int or count != chain.records + cast(int, chain.count_offset):  # set above
                return self.fail(chain_id, seq, f"checkpoint at seq {seq} does not match the records before it")
            chain.signed_seq = seq
            chain.closed = entry.get("final") is True
            chain.tail_time = None
        elif chain.tail_time is None:
            chain.tail_time = _time_of(entry)
        chain.records += kind == RECORD
        chain.after_checkpoint = kind == CHECKPOINT and self.keys is not None
        chain.last_kind = kind
        chain.head = line_digest(line)
        chain.next_seq = seq + 1
        self._match_anchor(chain_id, chain, kind)

    def _match_anchor(self, chain_id: str, chain: _Chain, kind: str) -> None:
        anchored = self.anchored.get(chain_id) if self.anchored is not None else None
        head = anchored.heads.get(chain.next_seq) if anchored is not None else None
        if head is None:
            return
        if head == chain.head:
            chain.anchored_seq = chain.next_seq
        elif chain.next_seq == chain.first_seq:  # the chain's first entry here links to another head
            self.fail(chain_id, chain.first_seq, f"{_name(kind, chain.first_seq)} does not follow the anchored chain "
                                                 "(altered or replaced)")
        else:
            signed = chain.signed_seq + 1 if chain.signed_seq is not None and self.keys is not None else 0
            # What a checkpoint signed is as it was signed: the difference lies after it.
            first = min(max(chain.anchored_seq, chain.first_seq, signed), chain.next_seq - 1)
            self.fail(chain_id, first, f"{_span(first, chain.next_seq - 1, 'differs/differ')} from the anchor for "
                                       f"seq {chain.next_seq} (altered or replaced)")

    def _not_an_entry(self) -> None:
        position, where, _, _ = self.pending  # type: ignore[misc]  # called while a line is pending
        self.pending = None
        self.problems.append((position, None, None, f"{where} is not an audit entry"))

    def _torn_line_ended(self, entry: dict) -> None:
        _, where, data, _ = self.pending  # type: ignore[misc]  # called while a line is pending
        named = entry.get("torn_sha256") == hashlib.sha256(data).hexdigest() and entry.get("torn_bytes") == len(data)
        if entry["type"] == RECORD and entry.get("event") == TORN_LINE_ENDED and named:
            self.pending = None
            self.notes.append(f"{where} is a torn entry ({len(data)} bytes; its writer stopped mid-write): "
                              f"chain {entry['chain']} ended the line when it started")
        else:
            self._not_an_entry()

    def report(self) -> VerifyReport:
        if self.pending is not None:
            _, where, data, terminated = self.pending
            if terminated:
                self._not_an_entry()
            else:
                self.pending = None
                self.notes.append(f"{where} is a torn last entry ({len(data)} bytes without a newline: "
                                  "its writer stopped mid-write)")
        problems, unverified, warnings, tails = self.problems + self._anchor_gaps(), [], [], []
        signer = "checkpoint" if self.anchored is None else "checkpoint or anchor"
        end_position = self.position + 1  # what is missing at a chain's end comes after what is there
        for chain_id, chain in self.chains.items():
            if chain.gap:
                first, found, position = chain.gap
                if chain.reordered:
                    reason = f"records out of order at seq {first}"
                elif found - first == 1:
                    reason = f"record {first} is missing (deleted)"
                else:
                    reason = f"records {first}-{found - 1} are missing (deleted)"
                problems.append((position, chain_id, first, reason))
            if chain.first_seq > 0:
                warnings.append(f"chain {chain_id} starts at seq {chain.first_seq}")
            if chain.failed:
                continue
            end = chain.next_seq
            anchored = self.anchored.get(chain_id) if self.anchored is not None else None
            if anchored is not None:
                if anchored.final_seq is not None and end > anchored.final_seq:
                    problems.append((end_position, chain_id, anchored.final_seq,
                                     f"{_span(anchored.final_seq, end - 1, 'follows/follow')} "
                                     "the chain's closing anchor (written after its writer shut down)"))
                    continue
                if anchored.last_seq > end:
                    closing = anchored.final_seq == anchored.last_seq == end + 1
                    missing = f"the closing checkpoint at seq {end} is" if closing else _span(
                        end, anchored.last_seq - 1, "is/are")
                    problems.append((end_position, chain_id, end, f"{missing} missing (deleted): an anchor vouches "
                                                                  f"for the chain through seq {anchored.last_seq - 1}"))
                    continue
            elif self.anchored is not None:
                warnings.append(f"chain {chain_id} has no anchor")
                unverified.append((chain_id, chain.first_seq,
                                   "the chain has no anchor (injected, or its writer never reached the anchor store)"))
            covered = chain.first_seq if chain.signed_seq is None else chain.signed_seq + 1
            covered = max(covered, chain.anchored_seq)
            if covered >= end:  # signed to its end; but is that the end? A closing anchor says so
                unclosed = self._unclosed(chain, anchored)
                if unclosed is not None:
                    warnings.append(f"chain {chain_id} has no closing anchor")
                    unverified.append((chain_id, end, unclosed))
                continue
            if covered == chain.first_seq:
                tails.append((chain_id, covered, f"no {signer} covers records from seq {covered}"))
                unverified.append((chain_id, covered, "the chain has no checkpoint: nothing in it is signed "
                                                      "(injected, or its writer crashed before signing)"))
                continue
            tails.append((chain_id, covered, f"no {signer} covers records after seq {covered - 1}"))
            if anchored is not None:  # a live writer anchors every checkpoint interval
                stale = self._stale(self.now - anchored.last_time, "old (its writer stopped)")
                why = f", and the chain's last anchor is {stale}"
            else:  # only the records' own time tells, and whoever wrote them chose it
                stale = self._stale(self.now - chain.tail_time)  # type: ignore[operator]  # set by the unsigned records
                why = f" and {stale}"
            if stale is not None:
                unsigned = _span(covered, end - 1, "is/are", "record")
                unverified.append((chain_id, covered, f"{unsigned} signed by no {signer}{why}: appended by someone "
                                                      "without the signing key, or left unsigned by a writer that "
                                                      "crashed"))
        if self.anchored is not None:
            absent = sum(1 for c, a in self.anchored.items() if c not in self.chains and a.last_seq > 0)
            if absent:
                warnings.append(f"{absent} anchored chains have no entries here "
                                "(other writers, rotated away, or deleted)")
        if self.keys is None:
            warnings.append("signatures were not checked (no public key)")
        warnings = [t[2] for t in tails] + self.notes + warnings
        counts: dict[str, Any] = dict(records=self.records, checkpoints=self.checkpoints, chains=len(self.chains),
                                      warnings=warnings, anchors=self.anchor_count)
        if problems:
            _, problem_chain, seq, reason = min(problems, key=lambda p: p[0])
            return VerifyReport(False, seq, reason, chain=problem_chain, verdict=TAMPERED, **counts)
        if self.strict and unverified:
            chain_id, seq, reason = unverified[0]
            return VerifyReport(False, seq, reason, chain=chain_id, verdict=UNVERIFIED, **counts)
        if tails:
            chain_id, seq, reason = tails[0]
            return VerifyReport(True, seq, reason, chain=chain_id, **counts)
        reason = warnings[0] if warnings else ("intact" if self.position else "no entries")
        return VerifyReport(True, None, reason, **counts)


PublicKeys = Ed25519PublicKey | Sequence[Ed25519PublicKey] | None  # several: keys used before a rotation


def _keys(public_key: PublicKeys) -> Sequence[Ed25519PublicKey] | None:
    return [public_key] if isinstance(public_key, Ed25519PublicKey) else public_key


def verify(lines: Iterable[str | bytes], public_key: PublicKeys, *, anchors: Iterable[str | bytes] | None = None,
           strict: bool = False, max_unsigned_age_s: float = DEFAULT_MAX_UNSIGNED_AGE_S,
           now: float | None = None) -> VerifyReport:
    """Checks entries in the order given. Several keys are allowed, for key rotation;
    None checks the chain only and says the signatures were not checked. `anchors` (lines
    of an anchor stream or file) need a key; `strict` turns what no signature vouches for
    into the "unverified" verdict (see the module's docstring)."""
    verifier = _Verifier(_keys(public_key), anchors, strict, max_unsigned_age_s, now)
    for number, line in enumerate(lines, 1):
        verifier.feed(line.rstrip("\n") if isinstance(line, str) else line.rstrip(b"\n"), f"line {number}")
    return verifier.report()


def verify_files(paths: Sequence[str | Path], public_key: PublicKeys, *, anchors: Iterable[str | bytes] | None = None,
                 strict: bool = False, max_unsigned_age_s: float = DEFAULT_MAX_UNSIGNED_AGE_S,
                 now: float | None = None, on_line: Callable[[bytes], None] | None = None) -> VerifyReport:
    """Checks files as one sequence of entries: give rotated files oldest first. A last
    line without its newline is a torn entry (the writer stopped mid-write), not tampering.
    `on_line` sees each line as it is checked, so a reader (the usage report) reads the
    files once; what it gathered counts only if the report is ok."""
    verifier = _Verifier(_keys(public_key), anchors, strict, max_unsigned_age_s, now)
    for path in paths:
        with open(path, "rb") as file:
            for number, raw in enumerate(file, 1):
                terminated = raw.endswith(b"\n")
                line = raw[:-1] if terminated else raw
                verifier.feed(line, f"{path}:{number}", terminated)
                if on_line is not None:
                    on_line(line)
    return verifier.report()
