"""An asyncio front for LLMEngine: a background thread steps the engine, callers stream deltas.

The engine is not thread-safe, so only the loop thread touches it. Callers validate and
tokenize on their own thread (make_sequence), then hand over adds and aborts through a
queue that the loop drains before every step; an abort therefore frees the request's
blocks before any further step runs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
import threading
from typing import AsyncIterator, Sequence as Seq

from engine.llm_engine import LLMEngine, RequestError
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams

logger = logging.getLogger(__name__)


class EngineDeadError(RuntimeError):
    """The engine loop stopped after an internal error; requests cannot be served."""


class _Stop:
    pass


class AsyncLLMEngine:
    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._wakeup = threading.Event()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._streams_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._dead: BaseException | None = None
        self._ids = itertools.count()

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="tenantgate-engine", daemon=True)
            self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        if self._thread is not None:
            self._commands.put(_Stop())
            self._wakeup.set()
            self._thread.join(timeout)
            self._thread = None

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    # -- requests -----------------------------------------------------------------

    async def generate(
        self,
        prompt: str | Seq[int],
        params: SamplingParams,
        request_id: str | None = None,
        add_special_tokens: bool = True,
    ) -> AsyncIterator[RequestOutput]:
        """Stream a request's deltas; leaving the loop early (or cancellation) aborts it."""
        if self._dead is not None:
            raise EngineDeadError("the engine loop has stopped")
        self.start()
        request_id = request_id or f"req-{next(self._ids)}"
        seq = self.engine.make_sequence(request_id, prompt, params, add_special_tokens)
        stream: asyncio.Queue = asyncio.Queue()
        with self._streams_lock:
            if request_id in self._streams:
                raise ValueError(f"request id {request_id!r} is already in flight")
            self._streams[request_id] = (asyncio.get_running_loop(), stream)
        self._commands.put(("add", seq))
        self._wakeup.set()
        finished = False
        try:
            while True:
                item = await stream.get()
                if isinstance(item, RequestError):
                    raise item
                if isinstance(item, BaseException):
                    raise EngineDeadError("the engine loop failed") from item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            with self._streams_lock:
                self._streams.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))
        self._wakeup.set()

    # -- the loop thread ------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                if not self._drain_commands():
                    return
                if not self.engine.has_unfinished_requests():
                    self._wakeup.wait()
                    self._wakeup.clear()
                    continue
                for out in self.engine.step():
                    self._deliver(out.request_id, out)
        except BaseException as exc:  # noqa: BLE001 - every waiting caller must hear about it
            logger.exception("engine loop failed")
            self._dead = exc
            with self._streams_lock:
                streams = list(self._streams)
            for request_id in streams:
                self._deliver(request_id, exc)

    def _drain_commands(self) -> bool:
        while True:
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True
            if isinstance(command, _Stop):
                return False
            kind, arg = command
            if kind == "add":
                with self._streams_lock:
                    wanted = arg.request_id in self._streams
                if wanted:  # the caller may have gone away before we got here
                    try:
                        self.engine.enqueue(arg)
                    except RequestError as exc:
                        self._deliver(arg.request_id, exc)
            else:
                self.engine.abort_request(arg)

    def _deliver(self, request_id: str, item: RequestOutput | BaseException) -> None:
        with self._streams_lock:
            target = self._streams.get(request_id)
        if target is not None:
            loop, stream = target
            loop.call_soon_threadsafe(stream.put_nowait, item)
