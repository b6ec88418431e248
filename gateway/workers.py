"""`tenantgate serve --workers N`: N gateway processes behind one listening socket.

One process runs one event loop on one core; past that, a gateway scales with processes. The
supervisor binds the API socket once and hands it to every worker (a fresh interpreter running
`tenantgate serve --worker-fd FD`), as gunicorn and uvicorn's own `--workers` do, rather than
letting each worker bind the port with SO_REUSEPORT: the kernel then keeps one queue of
connections that whichever worker is free accepts from (SO_REUSEPORT hashes each connection to
one worker's queue, busy or not), and a worker that dies or restarts drops no connection still
waiting in the queue, because the socket stays open here.

The supervisor restarts a worker that exits (after a short backoff), forwards SIGTERM and SIGINT
to every worker so each drains its requests (SHUTDOWN_TIMEOUT_S), and gives up with a non-zero
exit when workers keep dying: a gateway that cannot stay up must not look healthy to its
orchestrator. Each worker's stdout (the audit trail's stream sink) comes through a pipe and is
written out here a whole line at a time, so two workers' records never interleave mid-line.

What a worker keeps to itself, and what the workers share, is in docs/operations.md ("Workers").
"""

from __future__ import annotations

import collections
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO

logger = logging.getLogger("tenantgate.workers")

MAX_WORKERS = 64
POLL_S = 0.1  # how often the supervisor looks for a worker that exited, or a signal
BACKLOG = 2048  # connections the kernel queues for the workers to accept
RESTART_BACKOFF_S = (0.25, 0.5, 1.0, 2.0, 4.0)  # the wait before a restart, by deaths in the window
MAX_DEATHS, DEATH_WINDOW_S = 5, 60.0  # more exits than this within the window: the supervisor gives up
STOP_MARGIN_S = 10.0  # past a worker's own shutdown timeout, before it is killed
PARENT_CHECK_S = 1.0  # how often a worker checks that its supervisor is still there

EXIT_WORKERS_FAILING = 1


def bind_listener(host: str, port: int) -> socket.socket:
    """The API's listening socket, bound once and shared by every worker (inheritable)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(BACKLOG)
    sock.set_inheritable(True)
    return sock


def worker_env(index: int, metrics_port: int) -> dict[str, str]:
    """The settings in which worker `index` differs from the others: its operator listener's port
    (metrics_port + index; 0 stays 0), and its index, which gives it audit files of its own
    (`gateway.audit.worker_file`): two processes can neither listen on one port nor append to and
    rotate one file."""
    return {"TENANTGATE_METRICS_PORT": str(metrics_port + index if metrics_port else 0),
            "TENANTGATE_WORKER": str(index)}


@dataclass
class _Worker:
    index: int
    process: subprocess.Popen | None = None
    restart_at: float | None = 0.0  # when to start it next; None while it runs
    relay: threading.Thread | None = None


@dataclass
class Supervisor:
    """Runs `count` workers, each `command(index)` with `env(index)` added to this environment."""

    count: int
    command: Callable[[int], Sequence[str]]
    env: Callable[[int], dict[str, str]]
    listener: socket.socket  # the API socket every worker inherits (pass_fds)
    shutdown_timeout_s: float
    out: IO[bytes] = field(default_factory=lambda: sys.stdout.buffer)
    max_deaths: int = MAX_DEATHS
    death_window_s: float = DEATH_WINDOW_S

    def __post_init__(self) -> None:
        self._workers = [_Worker(i) for i in range(self.count)]
        self._deaths: collections.deque[float] = collections.deque()
        self._signalled: int | None = None
        self._out_lock = threading.Lock()

    def run(self) -> int:
        """Serves until SIGTERM or SIGINT (0 once every worker drained) or until workers keep dying (1)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        failing = False
        while self._signalled is None and not failing:
            now = time.monotonic()
            for worker in self._workers:
                if worker.restart_at is not None and now >= worker.restart_at:
                    self._start(worker)
                elif worker.restart_at is None and worker.process is not None and worker.process.poll() is not None:
                    failing = self._exited(worker, worker.process, now) or failing
            time.sleep(POLL_S)
        if failing:
            logger.error("workers keep dying (%d exits in %.0f s); stopping the others", len(self._deaths),
                         self.death_window_s)
        return self._stop() or (EXIT_WORKERS_FAILING if failing else 0)

    def _on_signal(self, signum: int, frame: object) -> None:
        self._signalled = signum

    def _start(self, worker: _Worker) -> None:
        process = subprocess.Popen(list(self.command(worker.index)), env={**os.environ, **self.env(worker.index)},
                                   pass_fds=(self.listener.fileno(),), stdout=subprocess.PIPE, process_group=0)
        worker.process, worker.restart_at = process, None
        # Own process groups: a terminal's Ctrl-C reaches the supervisor alone, which stops each worker once.
        worker.relay = threading.Thread(target=self._relay, args=(process.stdout,), daemon=True,
                                        name=f"worker-{worker.index}-stdout")
        worker.relay.start()
        logger.info("worker %d started (pid %d)", worker.index, process.pid)

    def _relay(self, stream: IO[bytes]) -> None:
        """A worker's stdout, written out whole line by whole line (audit records must not interleave)."""
        for line in iter(stream.readline, b""):
            with self._out_lock:
                self.out.write(line)
                self.out.flush()
        stream.close()

    def _exited(self, worker: _Worker, process: subprocess.Popen, now: float) -> bool:
        """Schedules the worker's restart; True when that is one death too many in the window."""
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > self.death_window_s:
            self._deaths.popleft()
        if len(self._deaths) > self.max_deaths:
            return True
        wait = RESTART_BACKOFF_S[min(len(self._deaths), len(RESTART_BACKOFF_S)) - 1]
        logger.warning("worker %d (pid %d) exited with %s; restarting it in %.2f s", worker.index, process.pid,
                       _status(process.returncode), wait)
        worker.restart_at = now + wait
        return False

    def _stop(self) -> int:
        """SIGTERM to every worker (each drains), SIGKILL to any still there past its shutdown timeout;
        1 if one had to be killed."""
        running = [w.process for w in self._workers if w.process is not None and w.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        # Each worker closes its copy of the socket as it starts draining; once this one is closed
        # too, new connections are refused, as with one process, instead of waiting in the queue.
        self.listener.close()
        deadline = time.monotonic() + self.shutdown_timeout_s + STOP_MARGIN_S
        killed = 0
        for process in running:
            try:
                process.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.error("worker pid %d did not stop in time; killing it", process.pid)
                process.kill()
                process.wait()
                killed += 1
        for worker in self._workers:
            if worker.relay is not None:
                worker.relay.join(5)
        return 1 if killed else 0


def _status(returncode: int) -> str:
    if returncode < 0:
        return f"signal {signal.Signals(-returncode).name}"
    return f"status {returncode}"


def watch_supervisor(parent: int) -> None:
    """In a worker: SIGTERM to itself (a graceful drain) once its supervisor is gone, so a killed
    supervisor never leaves workers serving behind it."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        logger.error("the supervisor (pid %d) is gone; stopping", parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()
