"""Whose turn it is to write the database: a lock file every writer of one
record store takes (``flock``) before SQLite's own write lock.

SQLite's lock is not a queue. A writer that finds the database locked sleeps
and polls (1, 2, 5 ... then every 100 ms) until its busy timeout, while a
writer that just committed begins its next transaction at once and wins again:
with two busy main workers writing back to back, the priority worker's records
and inbox rows waited seconds and hit its 2 s busy timeout ("database is
locked", `notify demo --events 5000`), an OTP's inbox row behind a campaign's
records. Waiters of ``flock`` sleep in the kernel and are woken when the lock is
released, and the kernel runs the woken thread of the higher priority first:
the priority worker's writer (nice 0) before the main workers', which yield the
core (pipeline/roles.py), so the OTP's write goes next instead of whenever its
poll happens to fall between two of theirs.

The turn is advisory and only orders the writers that take it; SQLite's lock
still guards the data (a writer that does not take it, an older process,
``sqlite3`` on the command line, is served by the busy timeout as before). The
kernel drops a dead process's lock with its file descriptor.
"""

from __future__ import annotations

import fcntl
import os
from typing import Optional

__all__ = ["WriteTurn", "SoleTurn"]


class WriteTurn:
    """The exclusive lock on ``<database>.wlock``, taken and given back by the thread
    that writes (store.py ``_transact``: the writer's own thread, in the job that
    runs the transaction)."""

    def __init__(self, db_path: str) -> None:
        self.path = f"{db_path}.wlock"
        self._fd: Optional[int] = None

    def take(self) -> None:
        """Wait for the turn in this thread (blocking)."""
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def give(self) -> None:
        """Give back the turn :meth:`take` took."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Let the file go (opened again by the next :meth:`take`)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class SoleTurn:
    """A job one process per database does (the receipt polls, agents/polls.py):
    :meth:`take` holds ``<database>.<name>`` (``flock``, not waiting) for as long as
    the process lives, or says another process holds it. The kernel drops a dead
    process's lock, so another worker takes the job over on its next try."""

    def __init__(self, db_path: str, name: str) -> None:
        self.path = f"{db_path}.{name}"
        self._fd: Optional[int] = None

    def take(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
