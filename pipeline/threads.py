"""Threads that hold a lock other processes wait for, started at a CPU priority
that cannot starve them.

A ``main`` worker lowers its CPU priority at start (pipeline/roles.py
``lower_priority``: ``SCHED_IDLE`` and nice +10) so that the priority worker,
Redis and the API get the cores first. Every thread it starts later inherits
that class, and a ``SCHED_IDLE`` thread gets no CPU at all while anything else
wants it. That is right for the event loop, and wrong for the record store's
writer thread: it holds SQLite's write lock, which the writers of every worker
share (one database file), and a holder left without CPU in the middle of a
transaction makes the priority worker's writes wait for it, up to the busy
timeout (a priority inversion: under `notify demo --events 5000` the high
worker's inbox rows and records waited 2 s, "database is locked", and its
commits overran to 5 s).

So a worker that lowers its priority first starts a *starter* thread that keeps
the ordinary class (``SCHED_OTHER``) with the nice increment only, and the lock
holders are started by it (:func:`start`): they inherit its class, so they are
weighted below the priority worker when the cores are short but never stopped
while they hold the lock. Unprivileged threads may lower their priority but not
raise it again (RLIMIT_NICE), hence a thread started before the lowering rather
than one raised afterwards.
"""

from __future__ import annotations

import queue
import threading
from typing import Optional

__all__ = ["start", "prepare_starter", "starter_tid"]

_starter: Optional["_Starter"] = None


class _Starter(threading.Thread):
    def __init__(self) -> None:
        super().__init__(name="notify-starter", daemon=True)
        self.requests: "queue.SimpleQueue[tuple[threading.Thread, threading.Event, list]]" = queue.SimpleQueue()

    def run(self) -> None:
        while True:
            thread, done, error = self.requests.get()
            try:
                thread.start()
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                error.append(exc)
            done.set()


def prepare_starter() -> int:
    """Start the starter thread (once) and return its native thread id, which the
    caller lowers with the nice increment only, never to ``SCHED_IDLE``."""
    global _starter
    if _starter is None or not _starter.is_alive():
        _starter = _Starter()
        _starter.start()
    return _starter.native_id or 0


def starter_tid() -> Optional[int]:
    """The starter's native thread id, or None when no starter runs."""
    return _starter.native_id if _starter is not None and _starter.is_alive() else None


def start(thread: threading.Thread) -> None:
    """Start ``thread`` from the starter when there is one (so it runs at the
    starter's class), else here. Blocks only until the thread has started."""
    s = _starter
    if s is None or not s.is_alive():
        thread.start()
        return
    done, error = threading.Event(), []
    s.requests.put((thread, done, error))
    done.wait()
    if error:
        raise error[0]
