"""Tasks a gateway component runs beside the requests (a policy watch, a key refresh, a lease
renewer, a load poller), started once and, when the component closes, cancelled and waited for."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine


async def cancel_and_wait(*tasks: asyncio.Task | None) -> None:
    """Cancels each task still running and returns once all have ended. Their own ending (cancelled,
    or an error) is theirs: only a cancellation of the caller itself propagates."""
    running = [task for task in tasks if task is not None and not task.done()]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


class BackgroundTask:
    """One long-running task of a component."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._task: asyncio.Task | None = None

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self, work: Coroutine) -> None:
        """Runs `work` as the task, unless it runs already (then `work` is dropped unstarted)."""
        if self._task is not None:
            work.close()
            return
        self._task = asyncio.get_running_loop().create_task(work, name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)
