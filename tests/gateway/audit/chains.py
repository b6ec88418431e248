"""Builds audit chains in memory for the tests, and edits them the way an attacker would."""

from __future__ import annotations

import base64
import json

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.audit.chain import canonical_json, key_id, signed_body
from gateway.audit.trail import AuditTrail


class ListSink:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.flushes = 0
        self.closed = False

    def write(self, line: str) -> None:
        self.lines.append(line)

    def flush(self) -> None:
        self.flushes += 1

    def close(self) -> None:
        self.closed = True


def record(i: int) -> dict:
    return {"request_id": f"req-{i}", "tenant": "t" * 32, "usage": {"prompt_tokens": i, "completion_tokens": 2 * i},
            "latency_ms": 1.5, "outcome": "ok"}


def build_chain(key: Ed25519PrivateKey | None, records: int, *, every: int = 100, chain_id: str = "chain-a") -> list[str]:
    sink = ListSink()
    with AuditTrail([sink], key, checkpoint_every=every, checkpoint_interval_s=3600, chain_id=chain_id) as trail:
        for i in range(records):
            trail.append(record(i))
    return sink.lines


def entries(lines: list[str]) -> list[dict]:
    return [json.loads(line) for line in lines]


def index_of(lines: list[str], seq: int) -> int:
    return next(i for i, line in enumerate(lines) if json.loads(line)["seq"] == seq)


def edit(lines: list[str], seq: int, **changes: object) -> list[str]:
    """Changes fields of one entry and writes it back in canonical form, as a careful attacker would."""
    lines = list(lines)
    i = index_of(lines, seq)
    lines[i] = canonical_json({**json.loads(lines[i]), **changes})
    return lines


def resign(checkpoint: dict, key: Ed25519PrivateKey) -> str:
    checkpoint = {**checkpoint, "key_id": key_id(key.public_key())}
    checkpoint["sig"] = base64.b64encode(key.sign(signed_body(checkpoint))).decode()
    return canonical_json(checkpoint)
