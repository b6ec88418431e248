"""The audit trail: chains each record to the one before it and signs the chain.

`AuditTrail.append` gives a record its place (`chain`, `seq`, `prev`) and writes the
same line to every sink, under one lock, so every sink sees one order. Every
`checkpoint_every` records, when the oldest unsigned record is `checkpoint_interval_s`
seconds old, and at `close()` (marked `final`), the trail writes a checkpoint signed with
Ed25519 and asks the sinks to make what they hold durable. That (an fsync for a file) runs on
the trail's own thread, outside the lock: `append` runs on the event loop that every tenant
shares, and an fsync can take milliseconds, more on a busy disk.

The chain's head is also anchored outside the sinks: when the trail starts, every
`checkpoint_interval_s` and at `close()` (`final`), it makes the sinks durable and then
writes a signed anchor (chain, seq, head, time) to the anchor sinks (a Redis Stream, a
file on other storage). A file alone cannot show its end was cut or extended; the
anchors can, and their times tell a live writer from one that stopped.

Anchors are numbered and chained to the anchor before (`number`, `prev`), so an anchor
deleted from its store while a later one remains is a gap verify reports.

A record is kept or refused, never dropped: a sink whose store refuses writes (a full
disk, a Redis queue at its bound) holds what it has in order and writes it once it can;
while it does, the trail is not `accepting` (the gateway refuses new requests), and once
a sink cannot hold a record too, `append` raises AuditRefused without giving it a seq
(the gateway then answers 503 instead of acknowledging the request). A sink that raises
on a write is counted in `sink_errors` and logged by seq number and sink type (never the
record): its copy of the chain gets a gap, which `tenantgate audit verify` reports.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from gateway.audit.verify import (
    ANCHOR,
    CHECKPOINT,
    RECORD,
    RESERVED_FIELDS,
    TORN_LINE_ENDED,
    anchor_genesis_digest,
    genesis_digest,
    key_id,
    line_digest,
    sign,
)
from gateway.encoding import canonical_json

logger = logging.getLogger("tenantgate.audit")
RETRY_S = 0.5  # how soon a sink that holds entries tries its store again


class AuditSink(Protocol):
    @property
    def repairs(self) -> Sequence[dict]: ...  # torn lines this sink ended on opening, for the trail (empty: none)
    @property
    def held(self) -> int: ...  # entries it keeps in memory, not yet in its store
    @property
    def stalled(self) -> bool: ...  # it holds entries its store refused, or as many as it may

    def accepts(self, line: str) -> bool: ...  # whether write(line) would keep it (written, or held)
    def write(self, line: str) -> None: ...  # one entry, without the newline; kept, never dropped
    def retry(self) -> None: ...  # writes what it holds, if its store takes it now
    def flush(self) -> None: ...  # called after each checkpoint: make the entries so far durable
    def close(self) -> None: ...


class AuditRefused(RuntimeError):
    """A sink cannot keep the record (its store refuses writes and it holds all it may): the
    record got no seq, so the request it describes must not be acknowledged."""


def load_or_create_signing_key(path: str | Path) -> Ed25519PrivateKey:
    """Reads an Ed25519 private key (PEM), or creates one readable by its owner only."""
    path = Path(path)
    if not path.exists():
        key = Ed25519PrivateKey.generate()
        pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        # Written aside and linked into place: another process never reads half a key,
        # and two processes racing to create it end up sharing one.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".audit-key-")  # mode 0600
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(pem)
                file.flush()
                os.fsync(file.fileno())
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            os.unlink(tmp)
    loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(loaded, Ed25519PrivateKey):
        raise ValueError(f"{path} is not an Ed25519 private key")
    return loaded


def public_key_pem(key: Ed25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def boot_chain_id(prefix: str = "") -> str:
    """`prefix` (default: host name and process id) and a random nonce of this boot: a
    restarted container has the same pod name and PID 1, and must not continue an old chain."""
    return f"{prefix or f'{socket.gethostname()}-{os.getpid()}'}-{secrets.token_hex(4)}"


class AuditTrail:
    def __init__(
        self,
        sinks: Sequence[AuditSink],
        signer: Ed25519PrivateKey | None,
        *,
        checkpoint_every: int = 100,
        checkpoint_interval_s: float = 10.0,
        chain_id: str | None = None,
        anchors: Sequence[AuditSink] = (),
    ) -> None:
        if checkpoint_every < 1 or checkpoint_interval_s <= 0:
            raise ValueError("checkpoint_every must be >= 1 and checkpoint_interval_s > 0")
        if chain_id is not None and not chain_id:
            raise ValueError("chain_id must not be empty")
        if anchors and signer is None:
            raise ValueError("anchors are signed: they need a signer")
        self.sinks = list(sinks)
        self.anchors = list(anchors)
        self.chain_id = chain_id or uuid.uuid4().hex[:16]
        self.checkpoint_every = checkpoint_every
        self.checkpoint_interval_s = checkpoint_interval_s
        self.sink_errors = 0
        self.refused = 0  # records no sink could keep
        self._signer = signer
        self._key_id = key_id(signer.public_key()) if signer is not None else None
        self._lock = threading.Lock()
        self._errors_lock = threading.Lock()  # sink_errors: the timer counts flush failures without _lock
        self._seq = 0
        self._head = genesis_digest(self.chain_id)
        self._records = 0
        self._unsigned = 0  # records since the last checkpoint
        self._unsigned_since = 0.0  # when the oldest of them was written (monotonic)
        self._anchored_at = 0.0  # when the last anchor was written (monotonic)
        self._anchors_written = 0  # the next anchor's number
        self._anchor_head = anchor_genesis_digest(self.chain_id)  # the digest of the last anchor
        self._closed = False
        self._sync_due = False  # a checkpoint was written since the sinks were last made durable
        self._stop = threading.Event()
        self._wake = threading.Event()  # the timer's: a checkpoint waits for its sync, or close()
        with self._lock:
            self._anchor(self._position())  # the chain exists from here: a chain no anchor announced is not ours
            for sink in self.sinks:  # a file sink that found a torn last line ended it; say so
                for repair in sink.repairs:
                    self._append({"event": TORN_LINE_ENDED, **repair})
        # Signs a quiet trail's last records within the interval, not at the next request, and
        # writes what a sink held once its store takes it again.
        self._timer = threading.Thread(target=self._tick, name="audit-checkpoint", daemon=True)
        self._timer.start()

    @property
    def public_key(self):
        """The key that verifies this trail's checkpoints (None: unsigned)."""
        return self._signer.public_key() if self._signer is not None else None

    @property
    def seq(self) -> int:
        """The seq the next entry will get."""
        return self._seq

    @property
    def accepting(self) -> bool:
        """False while a sink holds entries its store refused (or as many as it may): no new work
        should start whose record the trail may not be able to keep."""
        return not any(sink.stalled for sink in self.sinks)

    @property
    def held(self) -> int:
        """Entries the sinks keep in memory, not yet in their stores."""
        return sum(sink.held for sink in self.sinks)

    def append(self, record: dict) -> dict:
        """Chains and writes one record; returns the entry as written. Raises AuditRefused when a
        sink cannot keep it (the record then has no seq, and the chain goes on without it)."""
        if not isinstance(record, dict):
            raise TypeError("an audit record is a dict")
        if RESERVED_FIELDS & record.keys():
            raise ValueError(f"an audit record must not set {sorted(RESERVED_FIELDS & record.keys())}")
        with self._lock:
            if self._closed:
                raise RuntimeError("the audit trail is closed")
            return self._append(record)

    def checkpoint(self) -> dict | None:
        """Signs the chain now; None when there is no signer or nothing new to sign. The sinks
        are made durable moments later, on the trail's thread."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the audit trail is closed")
            return self._checkpoint()

    def close(self) -> None:
        """Writes the final checkpoint and anchor, then flushes and closes every sink. Idempotent."""
        self._stop.set()
        self._wake.set()
        self._timer.join()
        with self._lock:
            if self._closed:
                return
            self._checkpoint(final=True)
            self._closed = True
        for sink in self.sinks + self.anchors:
            try:
                sink.close()
            except Exception as exc:  # noqa: BLE001 - one sink that fails to close must not keep the others open
                logger.error("audit sink %s failed to close (%s)", _name(sink), _name(exc))

    def __enter__(self) -> AuditTrail:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _append(self, record: dict) -> dict:
        entry = {**record, "type": RECORD, "chain": self.chain_id, "seq": self._seq, "prev": self._head}
        try:
            line = canonical_json(entry)
        except (TypeError, ValueError):
            raise ValueError(f"audit record {self._seq} is not plain JSON (or holds NaN)") from None
        full = [_name(sink) for sink in self.sinks if not sink.accepts(line)]
        if full or not self._write(line):
            self.refused += 1
            logger.error("audit record refused at seq %d: %s cannot keep it (its store refuses writes); "
                         "the request is not acknowledged", self._seq, ", ".join(full) or "no sink")
            raise AuditRefused(f"no room for audit record {self._seq}")
        self._records += 1
        self._unsigned += 1
        if self._unsigned == 1:
            self._unsigned_since = time.monotonic()
        if self._unsigned >= self.checkpoint_every or self._overdue():
            self._checkpoint()
        return entry

    def _write(self, line: str) -> bool:
        """Writes the entry to every sink; it takes its seq unless every sink failed it."""
        kept = 0
        for sink in self.sinks:
            try:
                sink.write(line)
                kept += 1
            except Exception as exc:  # noqa: BLE001 - one sink that fails must not keep the entry from the others
                # Names the seq and types only: a sink's exception message may quote the line.
                self._count_sink_error()
                logger.error("audit sink %s failed to write seq %d (%s)", _name(sink), self._seq, _name(exc))
        if self.sinks and not kept:
            return False
        self._head = line_digest(line)
        self._seq += 1
        return True

    def _count_sink_error(self) -> None:
        with self._errors_lock:
            self.sink_errors += 1

    def _position(self) -> tuple[int, str, int]:
        """Where the chain is: the next seq, the head and the records written (under the lock)."""
        return self._seq, self._head, self._records

    def _signed(self, kind: str, final: bool, position: tuple[int, str, int] | None = None) -> dict:
        seq, head, records = position or self._position()
        document = {"type": kind, "chain": self.chain_id, "seq": seq, "head": head,
                    "count": records, "time": round(time.time(), 3), "key_id": self._key_id}
        if kind == ANCHOR:
            document |= {"number": self._anchors_written, "prev": self._anchor_head}
        return sign({**document, "final": True} if final else document, self._signer)

    def _checkpoint(self, final: bool = False) -> dict | None:
        """Signs the unsigned records; `final` (at close) always writes one, so that
        nothing can follow the chain's last entry unnoticed, makes the sinks durable and
        anchors it. Otherwise the timer makes them durable (`_sync_due`), off the caller's thread."""
        if self._signer is None:
            return None
        checkpoint = None
        if self._unsigned or (final and self._seq):
            checkpoint = self._signed(CHECKPOINT, final)
            if not self._write(canonical_json(checkpoint)):  # the next interval signs them
                return None
            self._unsigned = 0
            if final:
                self._flush(self.sinks, checkpoint["seq"])
            else:
                self._sync_due = True
                self._wake.set()
        if final:
            self._anchor(self._position(), final=True)
        return checkpoint

    def _anchor(self, position: tuple[int, str, int], final: bool = False, flushed: bool = False) -> None:
        """Anchors the chain at `position` (`flushed`: the sinks were made durable once it was
        there). Only one thread anchors at a time: the constructor and close() (the timer is not
        running then) or the timer, which holds no lock meanwhile."""
        if not self.anchors:
            return
        # Durable first: an anchor must never vouch for entries a power cut can still take
        # away (the sinks are flushed once the chain is at `position`, so everything up to it
        # is on disk). A sink that cannot flush (a full disk) holds anchoring back; the timer
        # retries.
        if not self.accepting or not (flushed or self._flush(self.sinks, position[0] - 1)):
            return
        line = canonical_json(self._signed(ANCHOR, final, position))
        # Every store takes the anchor or none does: a number skipped in one would read as a deleted anchor.
        if not all(sink.accepts(line) for sink in self.anchors):
            logger.error("audit anchor at seq %d held back: an anchor store refuses writes", position[0])
            self._anchored_at = time.monotonic()  # tried again in an interval
            return
        kept = 0
        for sink in self.anchors:
            try:
                sink.write(line)
                kept += 1
            except Exception as exc:  # noqa: BLE001 - one anchor sink that fails must not keep it from the others
                self._count_sink_error()
                logger.error("audit anchor sink %s failed to write the anchor at seq %d (%s)", _name(sink),
                             position[0], _name(exc))
        if kept:
            self._anchors_written += 1
            self._anchor_head = line_digest(line)
        self._flush(self.anchors, position[0])
        self._anchored_at = time.monotonic()

    def _flush(self, sinks: list[AuditSink], seq: int) -> bool:
        ok = True
        for sink in sinks:
            try:
                sink.flush()
            except Exception as exc:  # noqa: BLE001 - a sink that fails to flush is counted; the others still flush
                ok = False
                self._count_sink_error()
                logger.error("audit sink %s failed to flush at seq %d (%s)", _name(sink), seq, _name(exc))
        return ok

    def _overdue(self) -> bool:
        return self._unsigned > 0 and time.monotonic() - self._unsigned_since >= self.checkpoint_interval_s

    def _tick(self) -> None:
        """The timer: signs overdue records, retries held entries, and does the slow part of
        durability (fsync, anchors) without the lock, so appends never wait for a disk."""
        while True:
            self._wake.wait(min(self.checkpoint_interval_s / 4, RETRY_S))
            self._wake.clear()
            if self._stop.is_set():
                return
            with self._lock:
                if self._closed:
                    return
                for sink in self.sinks + self.anchors:
                    if sink.stalled:
                        sink.retry()
                if self._overdue():
                    self._checkpoint()
                sync, self._sync_due = self._sync_due, False
                # Also when idle: a recent anchor says the writer is alive.
                anchor = time.monotonic() - self._anchored_at >= self.checkpoint_interval_s
                position = self._position()
            if sync or anchor:
                flushed = self._flush(self.sinks, position[0] - 1)
                if anchor and flushed:
                    self._anchor(position, flushed=True)


def _name(obj: object) -> str:
    return type(obj).__name__
