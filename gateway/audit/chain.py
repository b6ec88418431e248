"""The audit chain's format, and the verifier that finds the first altered entry.

Every entry is one line of canonical JSON and names its chain (`chain`) and position
(`seq`). A record carries `prev`, the SHA-256 of the previous entry's line; a signed
checkpoint carries the same digest as `head`, with an Ed25519 signature over the rest
of itself. A checkpoint vouches for everything before it, since every entry commits to
the one before; entries after the last checkpoint are only chained, not signed.

Entries of several chains may interleave (replicas share a Redis stream; a restarted
process starts a new chain in the same file), so the verifier follows each chain on
its own. Problems name seq numbers, never record contents.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

RECORD, CHECKPOINT = "record", "checkpoint"
RESERVED_FIELDS = frozenset({"type", "chain", "seq", "prev"})
# json.dumps leaves these raw with ensure_ascii=False, and str.splitlines() and many
# log viewers break lines at them; escaped, one entry is always one line.
_LINE_BREAKS = {"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"}


def canonical_json(value: object) -> str:
    """Sorted keys, no whitespace, UTF-8 text, no NaN: the exact text an entry is hashed as."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    for raw, escaped in _LINE_BREAKS.items():
        text = text.replace(raw, escaped)
    return text


def line_digest(line: str) -> str:
    return hashlib.sha256(line.encode("utf-8")).hexdigest()


def genesis_digest(chain_id: str) -> str:
    """The `prev` of a chain's first entry, so a chain's true beginning can be recognised."""
    return hashlib.sha256(b"tenantgate-audit-genesis:" + chain_id.encode("utf-8")).hexdigest()


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


def _signature_ok(checkpoint: dict, keys: dict[str, Ed25519PublicKey]) -> bool:
    key = keys.get(checkpoint.get("key_id"))
    try:
        key.verify(base64.b64decode(checkpoint["sig"], validate=True), signed_body(checkpoint))
    except (AttributeError, KeyError, TypeError, ValueError, InvalidSignature):
        return False
    return True


def _name(kind: str, seq: int) -> str:
    return f"checkpoint at seq {seq}" if kind == CHECKPOINT else f"record {seq}"


@dataclass
class VerifyReport:
    ok: bool  # False only for tampering; an unsigned tail or a late start are warnings
    first_bad_seq: int | None  # the problem's seq, else the first seq no checkpoint covers
    reason: str
    records: int
    checkpoints: int
    chains: int = 0
    chain: str | None = None  # the chain first_bad_seq belongs to
    warnings: list[str] = field(default_factory=list)


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


class _Verifier:
    def __init__(self, public_keys: Sequence[Ed25519PublicKey] | None) -> None:
        self.keys = None if public_keys is None else {key_id(k): k for k in public_keys}
        self.chains: dict[str, _Chain] = {}
        self.problems: list[tuple[int, str | None, int | None, str]] = []  # (position, chain, seq, reason)
        self.records = self.checkpoints = 0
        self.position = 0

    def fail(self, chain_id: str | None, seq: int | None, reason: str) -> None:
        self.problems.append((self.position, chain_id, seq, reason))
        if chain_id in self.chains:
            self.chains[chain_id].failed = True

    def feed(self, raw: str | bytes, where: str) -> None:
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
            self.fail(None, None, f"{where} is not an audit entry")
            return
        self.records += kind == RECORD
        self.checkpoints += kind == CHECKPOINT
        chain = self.chains.get(chain_id)
        if chain is None:
            chain = self.chains[chain_id] = _Chain(seq, seq, link if seq else genesis_digest(chain_id))
            chain.count_offset = 0 if seq == 0 else None
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
            if type(count) is not int or count != chain.records + chain.count_offset:
                return self.fail(chain_id, seq, f"checkpoint at seq {seq} does not match the records before it")
            chain.signed_seq = seq
        chain.records += kind == RECORD
        chain.after_checkpoint = kind == CHECKPOINT and self.keys is not None
        chain.last_kind = kind
        chain.head = line_digest(line)
        chain.next_seq = seq + 1

    def report(self) -> VerifyReport:
        problems, warnings, tails = list(self.problems), [], []
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
            if not chain.failed and chain.signed_seq != chain.next_seq - 1:
                if chain.signed_seq is None:
                    tail = chain.first_seq, f"no checkpoint covers records from seq {chain.first_seq}"
                else:
                    tail = chain.signed_seq + 1, f"no checkpoint covers records after seq {chain.signed_seq}"
                tails.append((chain_id, *tail))
        if self.keys is None:
            warnings.append("signatures were not checked (no public key)")
        warnings = [t[2] for t in tails] + warnings
        counts = dict(records=self.records, checkpoints=self.checkpoints, chains=len(self.chains), warnings=warnings)
        if problems:
            _, chain_id, seq, reason = min(problems, key=lambda p: p[0])
            return VerifyReport(False, seq, reason, chain=chain_id, **counts)
        if tails:
            chain_id, seq, reason = tails[0]
            return VerifyReport(True, seq, reason, chain=chain_id, **counts)
        reason = warnings[0] if warnings else ("intact" if self.position else "no entries")
        return VerifyReport(True, None, reason, **counts)


PublicKeys = Ed25519PublicKey | Sequence[Ed25519PublicKey] | None  # several: keys used before a rotation


def _keys(public_key: PublicKeys) -> Sequence[Ed25519PublicKey] | None:
    return [public_key] if isinstance(public_key, Ed25519PublicKey) else public_key


def verify(lines: Iterable[str | bytes], public_key: PublicKeys) -> VerifyReport:
    """Checks entries in the order given. Several keys are allowed, for key rotation;
    None checks the chain only and says the signatures were not checked."""
    verifier = _Verifier(_keys(public_key))
    for number, line in enumerate(lines, 1):
        verifier.feed(line.rstrip("\n") if isinstance(line, str) else line.rstrip(b"\n"), f"line {number}")
    return verifier.report()


def verify_files(paths: Sequence[str | Path], public_key: PublicKeys) -> VerifyReport:
    """Checks files as one sequence of entries: give rotated files oldest first."""
    verifier = _Verifier(_keys(public_key))
    for path in paths:
        with open(path, "rb") as file:
            for number, raw in enumerate(file, 1):
                verifier.feed(raw[:-1] if raw.endswith(b"\n") else raw, f"{path}:{number}")
    return verifier.report()
