"""An asyncio front for the Encoder: one worker thread runs the steps the scheduler picks.

The event loop never waits on torch, and no request waits behind another tenant's whole batch:
each step is a small slice (at most batch_size inputs of the longest length, in tokens) filled
fairly across tenants (engine/encoder/scheduler.py), and a request is answered once its last input
is encoded. Inputs are checked before they queue, so one caller's bad input never fails a step
that holds another caller's.
"""

from __future__ import annotations

import asyncio
import logging
import threading

import torch

from engine.encoder.encoder import Encoder
from engine.encoder.scheduler import EncodeJob, EncoderScheduler, Slot
from engine.envelope import ExecutionEnvelope
from engine.errors import EngineDeadError

logger = logging.getLogger(__name__)


class _Pending:
    """A job's caller: its loop, its future and the rows encoded so far."""

    def __init__(self, job: EncodeJob, loop: asyncio.AbstractEventLoop, dimensions: int) -> None:
        self.job = job
        self.loop = loop
        self.future: asyncio.Future = loop.create_future()
        self.vectors = torch.empty(len(job.inputs), dimensions, dtype=torch.float32)

    def settle(self, outcome: torch.Tensor | BaseException) -> None:
        def resolve() -> None:
            if self.future.done():
                return  # the caller went
            if isinstance(outcome, BaseException):
                self.future.set_exception(outcome)
            else:
                self.future.set_result(outcome)

        try:
            self.loop.call_soon_threadsafe(resolve)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening
            pass


class AsyncEncoder:
    def __init__(self, encoder: Encoder) -> None:
        self.encoder = encoder
        self.scheduler = EncoderScheduler(max_tokens=encoder.batch_size * encoder.max_seq_length,
                                          quantum=encoder.max_seq_length)
        self._wakeup = threading.Condition()  # guards the scheduler, _pending, _thread and _closed
        self._pending: dict[int, _Pending] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self.steps = 0  # Encoder.embed calls run, for tests and benchmarks

    async def embed(self, inputs: list[list[int]], envelope: ExecutionEnvelope) -> torch.Tensor:
        """Unit vectors, one float32 row per input, in the order given. Raises EncoderError for
        inputs out of bounds (before anything queues). Cancelling drops the inputs not yet encoded."""
        self.encoder.check(inputs)
        job = EncodeJob(inputs, envelope)
        pending = _Pending(job, asyncio.get_running_loop(), self.encoder.dimensions)
        if not inputs:
            return pending.vectors
        with self._wakeup:
            if self._closed:
                raise EngineDeadError("the encoder was shut down")
            self._pending[job.id] = pending
            self.scheduler.add(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="tenantgate-encoder", daemon=True)
                self._thread.start()
            self._wakeup.notify()
        try:
            return await pending.future
        finally:
            with self._wakeup:
                job.cancelled = True  # a no-op once done; otherwise its remaining inputs never run
                self._pending.pop(job.id, None)

    def shutdown(self, timeout: float = 10.0) -> None:
        with self._wakeup:
            self._closed = True
            self._wakeup.notify()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)

    # -- the worker thread ------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._wakeup:
                while not self._closed and not self.scheduler.has_work():
                    self._wakeup.wait()
                if self._closed:
                    self._fail(list(self._pending.values()), EngineDeadError("the encoder was shut down"))
                    return
                slots = self.scheduler.next_step()
            self._run(slots)

    def _run(self, slots: list[Slot]) -> None:
        try:
            vectors = self.encoder.embed([job.inputs[index] for job, index in slots])
        except Exception as exc:  # noqa: BLE001 - every caller in this step must hear of it
            logger.error("an encoder step failed with %s", type(exc).__name__)
            with self._wakeup:
                jobs = {job.id: job for job, _ in slots}
                for job in jobs.values():
                    job.cancelled = True
                self._fail([self._pending[i] for i in jobs if i in self._pending], exc)
            return
        self.steps += 1
        finished = []
        with self._wakeup:
            for row, (job, index) in enumerate(slots):
                pending = self._pending.get(job.id)
                if pending is None:
                    continue  # its caller went
                pending.vectors[index] = vectors[row]
                job.done += 1
                if job.done == len(job.inputs):
                    finished.append(pending)
        for pending in finished:
            pending.settle(pending.vectors)

    @staticmethod
    def _fail(pendings: list[_Pending], exc: BaseException) -> None:
        for pending in pendings:
            pending.settle(exc)
