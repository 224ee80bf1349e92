"""The record store's write lock, urgent writes first.

One connection writes a record store per process, one transaction at a time. A
worker's sink writes its records in batches, and a lane its inbox rows; with a
plain lock an OTP's inbox row (what makes it DELIVERED, what the user sees) queued
behind every record batch already waiting, in arrival order. This lock hands
itself to a waiting urgent write before any other: an inbox row waits for the
transaction running, never for the ones queued.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

__all__ = ["UrgentFirstLock"]


class UrgentFirstLock:
    """``async with lock`` (ordinary) or ``async with lock.urgent()``."""

    def __init__(self) -> None:
        self._held = False
        self._waiting: tuple[deque, deque] = (deque(), deque())  # urgent, ordinary

    def locked(self) -> bool:
        return self._held

    async def acquire(self, urgent: bool = False) -> None:
        if not self._held and not any(self._waiting):
            self._held = True
            return
        fut = asyncio.get_running_loop().create_future()
        queue = self._waiting[0 if urgent else 1]
        queue.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release()  # handed over just as we were cancelled: pass it on
            else:
                queue.remove(fut)
            raise

    def release(self) -> None:
        for queue in self._waiting:
            while queue:
                fut = queue.popleft()
                if not fut.done():
                    fut.set_result(None)  # held on: the lock passes straight to it
                    return
        self._held = False

    async def __aenter__(self) -> "UrgentFirstLock":
        await self.acquire()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.release()

    def urgent(self) -> "_Urgent":
        return _Urgent(self)


class _Urgent:
    def __init__(self, lock: UrgentFirstLock) -> None:
        self.lock = lock

    async def __aenter__(self) -> UrgentFirstLock:
        await self.lock.acquire(urgent=True)
        return self.lock

    async def __aexit__(self, *exc: Any) -> None:
        self.lock.release()
