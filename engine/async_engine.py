"""An asyncio front for LLMEngine: a background thread steps the engine, callers stream deltas.

The engine is not thread-safe, so only the loop thread touches it. Callers validate and
tokenize on their own thread (make_sequence; a schema compiles on the grammars' workers, awaited),
then hand over adds and aborts through a queue that the loop drains before every step; an abort
therefore frees the request's blocks before any further step runs. Every stream ends: with its last
delta, with an abort delta, or with EngineDeadError when the loop fails or shuts down.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from collections.abc import AsyncGenerator
from collections.abc import Sequence as Seq
from dataclasses import dataclass

from engine.envelope import ExecutionEnvelope
from engine.errors import EngineDeadError, RequestError
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

logger = logging.getLogger(__name__)


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue
    seq: Sequence


_STOP = object()


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._lock = threading.Lock()  # guards _streams, _dead and _thread
        self._streams: dict[str, _Stream] = {}
        self._thread: threading.Thread | None = None
        self._dead: BaseException | None = None
        self._ids = itertools.count()

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        with self._lock:
            self._start_locked()

    def _start_locked(self) -> None:
        if self._dead is not None:
            raise EngineDeadError("the engine loop has stopped")
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tenantgate-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop after its current step; open streams end with EngineDeadError."""
        with self._lock:
            thread = self._thread
        if thread is None:
            return
        self._commands.put(_STOP)
        self._wakeup.set()
        thread.join(timeout)

    @property
    def is_running(self) -> bool:
        with self._lock:
            return self._thread is not None and self._thread.is_alive() and self._dead is None

    # -- requests -----------------------------------------------------------------

    async def generate(
        self,
        prompt: str | Seq[int],
        params: SamplingParams,
        envelope: ExecutionEnvelope,
        request_id: str | None = None,
        add_special_tokens: bool = True,
    ) -> AsyncGenerator[RequestOutput, None]:
        """Stream a request's deltas; leaving the loop early (or cancellation) aborts it."""
        request_id = request_id or f"req-{next(self._ids)}"
        grammar = None
        if params.json_schema is not None and isinstance(envelope, ExecutionEnvelope):
            # Off this loop, on the grammars' own workers, bounded in time and fair across tenants.
            grammar = await self.engine.grammars.compile_async(params.json_schema, envelope)
        seq = self.engine.make_sequence(request_id, prompt, params, envelope, add_special_tokens, grammar=grammar)
        stream = _Stream(asyncio.get_running_loop(), asyncio.Queue(), seq)
        with self._lock:
            self._start_locked()
            if request_id in self._streams:
                raise RequestError(f"request id {request_id!r} is already in flight", param="request_id")
            self._streams[request_id] = stream
        self._send(("add", seq))
        unfinished = params.n  # the stream ends with the last choice's last delta
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, RequestError):
                    raise item
                if isinstance(item, BaseException):
                    raise EngineDeadError("the engine loop has stopped") from item
                unfinished -= item.finished
                yield item
                if not unfinished:
                    return
        finally:
            with self._lock:
                if self._streams.get(request_id) is stream:
                    del self._streams[request_id]
            if unfinished:
                # Abort this very request: the id may already belong to a newer one.
                self._send(("abort_seq", seq))

    def abort(self, request_id: str) -> None:
        """Abort a request from outside its stream; the stream ends with finish_reason 'abort'."""
        self._send(("abort", request_id))

    def _send(self, command: object) -> None:
        self._commands.put(command)
        self._wakeup.set()

    # -- the loop thread ------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while self._drain_commands():
                if not self.engine.has_unfinished_requests():
                    self._wakeup.wait()
                    self._wakeup.clear()
                    continue
                for out in self.engine.step():
                    self._deliver(out.request_id, out)
            self._fail_all(EngineDeadError("the engine was shut down"))
        except BaseException as exc:  # every waiting caller must hear about it
            logger.exception("engine loop failed")
            self._fail_all(exc)

    def _drain_commands(self) -> bool:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True
            if command is _STOP:
                return False
            kind, arg = command
            if kind == "add":
                with self._lock:
                    stream = self._streams.get(arg.request_id)
                if stream is None or stream.seq is not arg:
                    continue  # the caller left before its request reached the loop
                try:
                    self.engine.enqueue(arg)
                except RequestError as exc:
                    self._deliver(arg.request_id, exc)
            elif kind == "abort_seq":
                live = self.engine.scheduler.find(arg.request_id)
                if live is not None and live.choices is arg.choices:
                    self.engine.abort_choices(arg.request_id)
            else:
                for final in self.engine.abort_choices(arg):
                    self._deliver(arg, final)

    def _fail_all(self, exc: BaseException) -> None:
        with self._lock:
            self._dead = exc
            streams = list(self._streams)
        for request_id in streams:
            self._deliver(request_id, exc)

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        with self._lock:
            stream = self._streams.get(request_id)
        if stream is None:
            return
        try:
            stream.loop.call_soon_threadsafe(stream.queue.put_nowait, item)
        except RuntimeError:  # the caller's event loop is closed: nobody is listening
            with self._lock:
                if self._streams.get(request_id) is stream:
                    del self._streams[request_id]
