"""Child processes, written once: stopping them (SIGTERM, then SIGKILL what is
still running after a grace period) and the environment of a spawned worker.

Used by ``notify run``'s supervisor (pipeline/supervise.py), the embedded server
(pipeline/embedded.py), ``notify demo``, the benchmarks and the tests' helpers.
A process is anything with ``poll``, ``send_signal``, ``wait`` and ``kill`` as
``subprocess.Popen`` has them.
"""

from __future__ import annotations

import signal
import subprocess
import time
from typing import Any, Callable, Iterable, Mapping, Optional

__all__ = ["stop_process", "stop_all", "worker_env"]


def stop_all(procs: Iterable[Any], timeout: float = 30.0,
             on_hung: Optional[Callable[[Any], None]] = None) -> list:
    """SIGTERM every process still running, then wait for them all, ``timeout``
    seconds in all; what is still running then is killed (after ``on_hung(proc)``,
    e.g. a stack dump) and reaped. ``None`` entries are skipped. Returns the
    processes that had to be killed, in the order given."""
    procs = [p for p in procs if p is not None]
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    hung = []
    for p in procs:
        try:
            p.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            if on_hung is not None:
                on_hung(p)
            hung.append(p)
            p.kill()
            p.wait()
    return hung


def stop_process(proc: Any, timeout: float = 30.0) -> bool:
    """SIGTERM ``proc`` (if it still runs), SIGKILL it if it has not exited after
    ``timeout`` seconds; reaped either way. True if it had to be killed."""
    return bool(stop_all([proc], timeout))


def worker_env(base_env: Mapping[str, str], broker: Optional[str] = None, role: Optional[str] = None,
               workers: Optional[int] = None, index: Optional[int] = None, **extra: Any) -> dict[str, str]:
    """The environment of a spawned worker (``python -m pipeline.cli worker``):
    ``base_env`` (``os.environ`` or an earlier result) with ``NOTIFY_BROKER``,
    ``NOTIFY_ROLE`` (pipeline/roles.py), ``NOTIFY_WORKERS`` and
    ``NOTIFY_WORKER_INDEX`` (the worker's share of the partitions) and any other
    variables ``extra`` (``NOTIFY_DATA_DIR=...``), as strings. What is ``None`` is
    left as ``base_env`` has it."""
    env = dict(base_env)
    named = {"NOTIFY_BROKER": broker, "NOTIFY_ROLE": role, "NOTIFY_WORKERS": workers, "NOTIFY_WORKER_INDEX": index}
    env.update({k: str(v) for k, v in {**named, **extra}.items() if v is not None})
    return env
