"""The wall clock the pipeline's rules are given: ``now()``.

Every decision that depends on the calendar (the daily counters' day, quiet
hours, ``send_at``, dedup windows, when a timer is due, retry times) takes its
``now`` from here, so a test can move the clock of a running worker without
touching the system clock:

``NOTIFY_CLOCK_OFFSET_S`` (``settings.env.clock_offset_s``)
    seconds added to ``time.time()`` (fixed for the process);
``NOTIFY_CLOCK_FILE`` (``settings.env.clock_file``)
    a file holding the offset in seconds (a float); re-read when its
    modification time changes, at most every 0.1 s, so writing a new number to
    it makes the running worker's clock jump (forward or back). A missing or
    unreadable file means offset 0 (plus ``NOTIFY_CLOCK_OFFSET_S``).

A process applies them with :func:`configure` (pipeline/app.py ``create_app``
does for a worker). Neither set (production): ``now()`` is ``time.time()``. Only wall-clock
decisions use it; timeouts, leases and latencies keep ``time.monotonic``.
"""

from __future__ import annotations

import os
import time
from typing import Optional

__all__ = ["configure", "now", "offset"]

#: set by the process's factory from ``settings.env`` (:func:`configure`)
_BASE = 0.0
_FILE: Optional[str] = None
_CHECK_EVERY_S = 0.1

_offset = _BASE
_checked = float("-inf")
_mtime: float | None = None


def _refresh() -> None:
    global _offset, _checked, _mtime
    t = time.monotonic()
    if t - _checked < _CHECK_EVERY_S:
        return
    _checked = t
    try:
        mtime = os.stat(_FILE).st_mtime_ns  # type: ignore[arg-type]
    except OSError:
        _offset, _mtime = _BASE, None
        return
    if mtime == _mtime:
        return
    try:
        with open(_FILE, encoding="ascii") as fh:  # type: ignore[arg-type]
            _offset = _BASE + float(fh.read().strip() or 0.0)
        _mtime = mtime
    except (OSError, ValueError):
        pass  # a half-written file: keep the last offset, read it again next time


def configure(offset_s: float, file: Optional[str]) -> None:
    """Set the clock's offset and file (``settings.env``), as a process's factory does."""
    global _BASE, _FILE, _offset, _checked, _mtime
    _BASE, _FILE = float(offset_s), file or None
    _offset, _checked, _mtime = _BASE, float("-inf"), None


def offset() -> float:
    """Seconds between the pipeline's clock and the system clock."""
    if _FILE:
        _refresh()
    return _offset


def now() -> float:
    """Unix time as the pipeline's rules see it."""
    if _FILE:
        _refresh()
    return time.time() + _offset
