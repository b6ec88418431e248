"""A thread pool whose callers are served fairly: at most `workers` jobs run at once and at most
`per_key` of one key's (a tenant's), and when a worker frees up the keys with waiting jobs take
turns (round robin), so one tenant's queue of expensive jobs never holds every worker, nor makes
another tenant wait behind all of it."""

from __future__ import annotations

import itertools
import threading
from collections import Counter, deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class FairExecutor:
    def __init__(self, workers: int, per_key: int, thread_name_prefix: str) -> None:
        if workers < 1 or per_key < 1:
            raise ValueError("workers and per_key must be at least 1")
        self._workers = workers
        self._per_key = per_key
        self._threads = ThreadPoolExecutor(workers, thread_name_prefix=thread_name_prefix)
        self._lock = threading.Lock()
        self._running: Counter[Hashable] = Counter()
        self._waiting: dict[Hashable, deque[tuple[Future, Callable[[], Any]]]] = {}
        # When each key with waiting or running jobs last got a worker: the longest unserved goes next.
        self._served: dict[Hashable, int] = {}
        self._ticks = itertools.count()

    def submit(self, key: Hashable, job: Callable[[], Any]) -> Future:
        """job's result, once a worker runs it. Cancelling the future before it starts skips the job."""
        future: Future = Future()
        with self._lock:
            self._waiting.setdefault(key, deque()).append((future, job))
            self._dispatch()
        return future

    def running(self, key: Hashable) -> int:
        with self._lock:
            return self._running[key]

    def shutdown(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)

    def _dispatch(self) -> None:
        # Under the lock. Of the keys that may run one more, the one served longest ago (or never): round robin.
        while sum(self._running.values()) < self._workers:
            eligible = [k for k in self._waiting if self._running[k] < self._per_key]
            if not eligible:
                return
            key = min(eligible, key=lambda k: self._served.get(k, -1))
            queue = self._waiting[key]
            future, job = queue.popleft()
            if not queue:
                del self._waiting[key]
            if future.set_running_or_notify_cancel():  # False: its caller cancelled it while it waited
                self._running[key] += 1
                self._served[key] = next(self._ticks)
                self._threads.submit(self._run, key, future, job)
            elif not self._running[key] and key not in self._waiting:
                self._forget(key)

    def _forget(self, key: Hashable) -> None:
        self._running.pop(key, None)
        self._served.pop(key, None)

    def _run(self, key: Hashable, future: Future, job: Callable[[], Any]) -> None:
        try:
            future.set_result(job())
        except BaseException as exc:  # noqa: BLE001 - the caller's future carries it
            future.set_exception(exc)
        finally:
            with self._lock:
                self._running[key] -= 1
                if not self._running[key] and key not in self._waiting:
                    self._forget(key)  # nothing of it left: its turn is not remembered
                self._dispatch()
