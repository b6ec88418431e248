"""Builds audit chains in memory for the tests, and edits them the way an attacker would."""

from __future__ import annotations

import json
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.audit.trail import AuditTrail
from gateway.audit.verify import canonical_json, genesis_digest, key_id, line_digest, sign


class ListSink:
    repairs = ()
    held = 0
    stalled = False

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.flushes = 0
        self.closed = False

    def accepts(self, line: str) -> bool:
        return True

    def write(self, line: str) -> None:
        self.lines.append(line)

    def retry(self) -> None:
        pass

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True


def record(i: int) -> dict:
    return {"request_id": f"req-{i}", "tenant": "t" * 32, "usage": {"prompt_tokens": i, "completion_tokens": 2 * i},
            "latency_ms": 1.5, "outcome": "ok"}


def build_chain(key: Ed25519PrivateKey | None, records: int, *, every: int = 100, chain_id: str = "chain-a",
                anchors: ListSink | None = None) -> list[str]:
    """A closed chain; its anchors (at the start and the close) go to `anchors` if given."""
    sink = ListSink()
    with AuditTrail([sink], key, checkpoint_every=every, checkpoint_interval_s=3600, chain_id=chain_id,
                    anchors=[anchors] if anchors is not None else ()) as trail:
        for i in range(records):
            trail.append(record(i))
    return sink.lines


def entries(lines: list[str]) -> list[dict]:
    return [json.loads(line) for line in lines]


def index_of(lines: list[str], seq: int, chain: str | None = None) -> int:
    return next(i for i, line in enumerate(lines)
                if json.loads(line)["seq"] == seq and chain in (None, json.loads(line)["chain"]))


def edit(lines: list[str], seq: int, chain: str | None = None, **changes: object) -> list[str]:
    """Changes fields of one entry and writes it back in canonical form, as a careful attacker would."""
    lines = list(lines)
    i = index_of(lines, seq, chain)
    lines[i] = canonical_json({**json.loads(lines[i]), **changes})
    return lines


def edit_and_relink(lines: list[str], seq: int, chain: str | None = None, **changes: object) -> list[str]:
    """Edits one record and re-links every later record of its chain: a consistent forgery
    that only a signature (a checkpoint or an anchor) can refute."""
    lines = edit(lines, seq, chain, **changes)
    chain, prev = json.loads(lines[index_of(lines, seq, chain)])["chain"], None
    for i, line in enumerate(lines):
        entry = json.loads(line)
        if entry["chain"] == chain and entry["seq"] >= seq:
            if prev is not None and entry["type"] == "record":
                lines[i] = canonical_json({**entry, "prev": prev})
            prev = line_digest(lines[i])
    return lines


def forge(count: int, *, after: str | None = None, chain_id: str | None = None) -> list[str]:
    """Records linked as the writer links them, continuing the entry `after` or starting a
    chain `chain_id` of their own: all that someone without the signing key can write."""
    if after is not None:
        last = json.loads(after)
        chain_id, seq, prev = last["chain"], last["seq"] + 1, line_digest(after)
    else:
        seq, prev = 0, genesis_digest(chain_id)
    lines = []
    for i in range(count):
        lines.append(canonical_json({**record(900 + i), "type": "record", "chain": chain_id, "seq": seq + i,
                                     "prev": prev}))
        prev = line_digest(lines[-1])
    return lines


def anchor_at(lines: list[str], seq: int, key: Ed25519PrivateKey, *, age_s: float = 0.0) -> str:
    """The anchor a live writer's timer publishes when `seq` is its chain's next seq (lines hold one chain)."""
    before = [(line, e) for line, e in zip(lines, entries(lines)) if e["seq"] < seq]
    chain = json.loads(lines[0])["chain"]
    head = line_digest(before[-1][0]) if before else genesis_digest(chain)
    anchor = {"type": "anchor", "chain": chain, "seq": seq, "head": head,
              "count": sum(e["type"] == "record" for _, e in before), "time": round(time.time() - age_s, 3),
              "key_id": key_id(key.public_key())}
    return canonical_json(sign(anchor, key))


def resign(checkpoint: dict, key: Ed25519PrivateKey) -> str:
    return canonical_json(sign({**checkpoint, "key_id": key_id(key.public_key())}, key))


def cut_mid_line(path: Path, keep: int = 40) -> bytes:
    """Leaves the file's last line `keep` bytes long, without its newline, as a power cut
    mid-write does (the page cache held the rest); returns the fragment."""
    data = path.read_bytes()
    start = data.rstrip(b"\n").rfind(b"\n") + 1
    path.write_bytes(data[: start + keep])
    return data[start : start + keep]
