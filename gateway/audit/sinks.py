"""Where audit entries go: stdout, a rotating file, a Redis Stream.

Each sink takes whole entries (`write(line)`, no newline), is told to make them
durable after each checkpoint (`flush()`), and is written by one AuditTrail, which
serialises the calls. None of them logs an entry's text.
"""

from __future__ import annotations

import collections
import errno
import glob
import hashlib
import itertools
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

logger = logging.getLogger("tenantgate.audit")


class StreamSink:
    """JSON lines on a text stream (stdout by default), for a log collector to pick up."""

    repairs = ()  # a stream has no last line to find torn
    held = 0  # the stream takes every line at once (a collector that stops reading blocks the write)
    stalled = False

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stdout  # looked up now, so a redirect counts
        self._lock = threading.Lock()  # the trail's timer flushes while a request writes

    def accepts(self, line: str) -> bool:
        return True

    def write(self, line: str) -> None:
        with self._lock:
            self.stream.write(line + "\n")

    def retry(self) -> None:
        """Nothing is held to retry."""

    def flush(self) -> None:
        with self._lock:
            self.stream.flush()

    def close(self) -> None:
        self.stream.flush()  # never closes stdout


DEFAULT_HOLD_BYTES = 8 << 20
CLOSE_RETRY_S = 0.1


class SinkStalled(OSError):
    """A sink holds entries its store refused: what it has is not yet durable."""


class RotatingFileSink:
    """Appends to `path`; past `max_bytes` it becomes `path.1` (older ones `path.2` …).

    The chain runs on across files: verify `rotated_files(path)`, oldest first. Every
    write reaches the OS at once (a crash of the process loses nothing); fsync runs after
    checkpoints and before anchors (on the trail's timer thread, while writes go on), and
    before a file is rotated away. What the disk refuses (full,
    over quota) is held in memory, in order, and written first once the disk takes it
    again (`retry()`, from the trail's timer); while anything is held the sink is
    `stalled`, and it `accepts` new entries only up to `hold_bytes`: it refuses, never
    drops. A crash or power loss mid-write can leave part of a line; the next open ends
    that line, so the next entry starts on a line of its own, and lists the repair in
    `repairs` for the trail to record.
    """

    def __init__(self, path: str | Path, max_bytes: int = 100 << 20, backup_count: int = 10,
                 hold_bytes: int = DEFAULT_HOLD_BYTES) -> None:
        if max_bytes < 1 or backup_count < 1 or hold_bytes < 1:
            raise ValueError("max_bytes, backup_count and hold_bytes must be at least 1")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backup_count = backup_count
        self.hold_bytes = hold_bytes
        self.repairs: list[dict] = []  # {"torn_bytes", "torn_sha256"} of each torn line ended
        self._held: collections.deque[bytes] = collections.deque()  # lines the disk has not taken, oldest first
        self._held_bytes = 0
        self._offset = 0  # how much of the first held line the disk took (a short write)
        self._refusing = False  # the disk refused the last write
        # write() comes from the trail's appends, flush() from its timer thread: the lock keeps
        # the held lines and the file in order between them; an fsync runs outside it.
        self._lock = threading.Lock()
        self._fd = self._open()

    @property
    def held(self) -> int:
        """Entries waiting in memory for the disk."""
        return len(self._held)

    @property
    def stalled(self) -> bool:
        return bool(self._held)

    def accepts(self, line: str) -> bool:
        return not self._held or self._held_bytes + len(line.encode("utf-8")) + 1 <= self.hold_bytes

    def _open(self) -> int:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o640)
        self._size = os.fstat(fd).st_size
        if self._size and os.pread(fd, 1, self._size - 1) != b"\n":
            torn = _last_line(fd, self._size)
            os.write(fd, b"\n")
            os.fsync(fd)
            self._size += 1
            self.repairs.append({"torn_bytes": len(torn), "torn_sha256": hashlib.sha256(torn).hexdigest()})
            logger.warning("audit file %s ended in part of a line (%d bytes); ended the line", self.path, len(torn))
        return fd

    def write(self, line: str) -> None:
        data = line.encode("utf-8") + b"\n"
        with self._lock:
            self._held.append(data)
            self._held_bytes += len(data)
            self._write_held()

    def retry(self) -> None:
        with self._lock:
            if self._held:
                self._write_held()

    def flush(self) -> None:
        """Makes every line written so far durable. The fsync goes through a duplicate of the
        descriptor, outside the lock, so writes go on meanwhile (one rotated away was synced
        before it was)."""
        with self._lock:
            if self._held and not self._write_held():
                raise SinkStalled(f"{len(self._held)} entries wait for the disk")
            fd = os.dup(self._fd)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def close(self, timeout: float = 5.0) -> None:
        """Gives the disk `timeout` seconds for what is held; what is left is lost, and logged."""
        if self._fd < 0:
            return
        deadline = time.monotonic() + timeout
        while not self._write_held() and time.monotonic() < deadline:
            time.sleep(CLOSE_RETRY_S)
        if self._held:
            logger.error("audit file %s: %d entries were never written (the disk refused them)", self.path,
                         len(self._held))
        try:
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1

    def _write_held(self) -> bool:
        """Writes the held lines in order, as far as the disk takes them; True when none is left."""
        try:
            while self._held:
                data = self._held[0]
                if not self._offset and self._size and self._size + len(data) > self.max_bytes:
                    self._rotate()
                written = os.write(self._fd, memoryview(data)[self._offset :])
                self._offset += written
                self._size += written
                if self._offset == len(data):
                    self._held.popleft()
                    self._held_bytes -= len(data)
                    self._offset = 0
        except OSError as exc:  # ENOSPC, EDQUOT, EFBIG, EIO: the disk's answer, never the entry's text
            if not self._refusing:
                reason = errno.errorcode.get(exc.errno or 0, type(exc).__name__)  # no errno: no code either
                logger.error("audit file %s refused a write (%s): holding its entries in memory, and refusing "
                             "new requests, until the disk takes them", self.path, reason)
            self._refusing = True
            return False
        if self._refusing:
            logger.warning("audit file %s takes writes again: the entries it held are written", self.path)
            self._refusing = False
        return True

    def _rotate(self) -> None:
        os.fsync(self._fd)
        for index in range(self.backup_count - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{index}")
            if older.exists():
                os.replace(older, self.path.with_name(f"{self.path.name}.{index + 1}"))
        os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        rotated, self._fd = self._fd, self._open()
        os.close(rotated)


def _last_line(fd: int, size: int, block: int = 1 << 16) -> bytes:
    """The bytes after the file's last newline (at most one entry's worth)."""
    end, parts = size, []
    while end > 0:
        start = max(0, end - block)
        data = os.pread(fd, end - start, start)
        cut = data.rfind(b"\n")
        if cut >= 0:
            parts.append(data[cut + 1 :])
            break
        parts.append(data)
        end = start
    return b"".join(reversed(parts))


WORKER_SUFFIX = ".worker-"


def worker_file(path: str | Path, index: int) -> Path:
    """Worker `index`'s own file beside `path` (`audit.jsonl.worker-1`): with `serve --workers N`
    each process appends to and rotates a file of its own, never one another writes."""
    path = Path(path)
    return path.with_name(f"{path.name}{WORKER_SUFFIX}{index}")


def trail_files(path: str | Path) -> list[Path]:
    """Every file of the trail named `path`: its own rotated files, then each worker's
    (`worker_file`), each oldest first. The workers' chains are separate, so verify follows
    each on its own whatever order the files come in."""
    path = Path(path)
    workers = []
    for candidate in path.parent.glob(glob.escape(path.name + WORKER_SUFFIX) + "*"):
        suffix = candidate.name[len(path.name) + len(WORKER_SUFFIX):]
        if suffix.isdigit():
            workers.append((int(suffix), candidate))
    return rotated_files(path) + [f for _, worker in sorted(workers) for f in rotated_files(worker)]


def rotated_files(path: str | Path) -> list[Path]:
    """`path.N` … `path.1`, then `path`: a rotated log oldest first, as verify wants it."""
    path = Path(path)
    backups = []
    for candidate in path.parent.glob(glob.escape(path.name) + ".*"):
        suffix = candidate.name[len(path.name) + 1 :]
        if suffix.isdigit():
            backups.append((int(suffix), candidate))
    return [p for _, p in sorted(backups, reverse=True)] + ([path] if path.exists() else [])


class RedisStreamSink:
    """XADDs entries to a Redis Stream from a background thread.

    `write` only queues, so a slow or unreachable Redis never holds up a request. While
    Redis is down, up to `buffer_size` entries wait and are retried with backoff; a full
    queue is `stalled` and `accepts` nothing more (the trail then refuses the record: it
    is never dropped). What is still queued when `close()` gives up counts in `dropped`.
    `healthy` says whether the last attempt reached Redis. Give the client socket
    timeouts: a hung connection otherwise holds the sender thread forever.
    """

    repairs = ()  # XADD writes whole entries: none is ever torn

    def __init__(
        self,
        client: Any,
        stream: str = "tenantgate:audit",
        maxlen: int = 1_000_000,
        *,
        buffer_size: int = 10_000,
        batch_size: int = 256,
        retry_initial_s: float = 0.05,
        retry_max_s: float = 5.0,
    ) -> None:
        from redis.exceptions import RedisError

        if buffer_size < 1 or batch_size < 1:
            raise ValueError("buffer_size and batch_size must be at least 1")
        self.client, self.stream, self.maxlen = client, stream, maxlen
        self.buffer_size, self.batch_size = buffer_size, batch_size
        self.retry_initial_s, self.retry_max_s = retry_initial_s, retry_max_s
        self.dropped = 0
        self.healthy = True
        self._errors = (RedisError, OSError)
        self._pending: collections.deque[str] = collections.deque()  # sent ones leave only once acknowledged
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="audit-redis", daemon=True)
        self._thread.start()

    @property
    def pending(self) -> int:
        return len(self._pending)

    held = pending  # entries in memory, not yet in Redis

    @property
    def stalled(self) -> bool:
        return len(self._pending) >= self.buffer_size

    def accepts(self, line: str) -> bool:
        return not self.stalled  # only the sender thread takes entries away, so this stays true until write()

    def write(self, line: str) -> None:
        with self._cond:
            if len(self._pending) >= self.buffer_size:
                raise SinkStalled(f"the queue holds {self.buffer_size} entries")  # the trail asks accepts() first
            self._pending.append(line)
            self._cond.notify()

    def retry(self) -> None:
        """The sender thread retries on its own."""

    def flush(self) -> None:
        """Does not wait for Redis (a checkpoint happens on a request's path); see drain()."""

    def drain(self, timeout: float) -> bool:
        """Waits until every queued entry is in Redis; False if that took longer than timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._pending, timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Gives Redis `timeout` seconds for what is queued; what is left counts as dropped."""
        self.drain(timeout)
        self._closing.set()
        with self._cond:
            self._cond.notify_all()
        self._thread.join(timeout)
        with self._cond:
            if self._pending:
                logger.warning("%d audit entries were not delivered to Redis", len(self._pending))
                self.dropped += len(self._pending)
                self._pending.clear()

    def _run(self) -> None:
        delay = self.retry_initial_s
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closing.is_set())
                if self._closing.is_set():
                    return
                batch = list(itertools.islice(self._pending, self.batch_size))
            try:
                # MULTI/EXEC: a failed batch left nothing behind, so resending it is safe.
                pipe = self.client.pipeline(transaction=True)
                for line in batch:
                    pipe.xadd(self.stream, {"entry": line}, maxlen=self.maxlen, approximate=True)
                pipe.execute()
            except self._errors as exc:
                if self.healthy:
                    logger.warning("audit stream unreachable (%s); %d entries queued", type(exc).__name__, self.pending)
                self.healthy = False
                if self._closing.wait(delay):
                    return
                delay = min(delay * 2, self.retry_max_s)
                continue
            with self._cond:
                for _ in range(min(len(batch), len(self._pending))):  # close() may have given up on them
                    self._pending.popleft()
                self._cond.notify_all()
            if not self.healthy:
                logger.warning("audit stream reachable again")
            self.healthy = True
            delay = self.retry_initial_s


def read_stream(client: Any, stream: str = "tenantgate:audit", *, batch: int = 1000) -> Iterator[bytes]:
    """The entries of a Redis Stream in stream order, as lines for `verify`.

    A batch whose EXEC reply was lost may have been written twice; an exact repeat of a
    recent line carries nothing new, so it is skipped rather than reported as reordering.
    """
    recent: collections.deque[bytes] = collections.deque()
    seen: set[bytes] = set()
    last = "-"
    while rows := client.xrange(stream, min=last, max="+", count=batch):
        for _entry_id, fields in rows:
            value = fields.get(b"entry", fields.get("entry", b""))
            raw = value if isinstance(value, bytes) else value.encode("utf-8")
            digest = hashlib.sha256(raw).digest()
            if digest in seen:
                continue
            seen.add(digest)
            recent.append(digest)
            if len(recent) > 10_000:
                seen.discard(recent.popleft())
            yield raw  # verify decodes it, and calls bytes that are not UTF-8 what they are
        last_id = rows[-1][0]
        last = "(" + (last_id.decode() if isinstance(last_id, bytes) else last_id)
