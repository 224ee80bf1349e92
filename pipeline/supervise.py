"""``notify run``'s process supervisor: a process that exits is started again, with
backoff, and the others stay up; everything stops only on a signal.

Each child (the embedded server, every worker, the API) is started from a
factory. When one exits (a crash, ``kill -9``, an out-of-memory kill) it is
started again after :func:`restart_delay` of its consecutive failures (0.5 s,
1 s, 2 s, … at most 30 s); a run of :data:`STABLE_S` seconds forgets the
failures. A child that exited :data:`LOOP_RESTARTS` times within
:data:`LOOP_WINDOW_S` is *crash looping*: it is still restarted (at the capped
delay), and that is what ``notify status``, the status page and the API's
``notify_process_crash_looping`` gauge say.

The state of every child (pid, restarts, last exit code, crash loop, up since)
is written to the broker (``Keys.supervisor``, a hash: ``<host>/<name>`` → JSON)
when it changes, so every reader of the broker sees it; writing it is best
effort (the broker itself may be what is restarting).
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import orjson

from pipeline.procs import stop_all

__all__ = ["Child", "Supervisor", "crash_looping", "restart_delay", "read_states",
           "BACKOFF_BASE_S", "BACKOFF_CAP_S", "STABLE_S", "LOOP_RESTARTS", "LOOP_WINDOW_S"]

log = logging.getLogger("notify.supervise")

BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 30.0
#: a child up this long has recovered: its next exit starts the backoff over
STABLE_S = 60.0
#: this many exits within LOOP_WINDOW_S seconds: crash looping
LOOP_RESTARTS = 5
LOOP_WINDOW_S = 300.0


def restart_delay(consecutive: int, base: float = BACKOFF_BASE_S, cap: float = BACKOFF_CAP_S) -> float:
    """Seconds to wait before the restart after ``consecutive`` failures in a row (>= 1)."""
    return min(cap, base * 2 ** max(0, consecutive - 1))


def crash_looping(exits: Any, now: float, window: float = LOOP_WINDOW_S, threshold: int = LOOP_RESTARTS) -> bool:
    """Whether ``threshold`` of the exit times ``exits`` fall within ``window`` before ``now``."""
    return sum(1 for t in exits if now - t <= window) >= threshold


@dataclass
class Child:
    """One supervised process: ``start`` makes it (an object with ``poll``, ``pid``,
    ``send_signal``, ``wait``, ``kill``, as ``subprocess.Popen``)."""

    name: str
    start: Callable[[], Any]
    proc: Any = None
    restarts: int = 0
    consecutive: int = 0
    started_at: float = 0.0
    due_at: Optional[float] = None  # when a restart is due
    last_exit: Optional[int] = None
    exits: deque = field(default_factory=lambda: deque(maxlen=LOOP_RESTARTS * 4))
    #: children to restart when this one is restarted (workers that hold what it
    #: gave them at start: the simulators' ports and credentials)
    restart_with: tuple[str, ...] = ()
    planned: bool = False  # stopped on purpose: its exit is not a failure
    #: the consumer group a worker reads as (reported, so that a command can tell
    #: which groups are meant to run while one restarts: pipeline/cli/send.py)
    group: Optional[str] = None

    def state(self, now: float) -> dict[str, Any]:
        up = self.proc is not None and self.proc.poll() is None
        return {"pid": self.proc.pid if up else None, "up": up, "restarts": self.restarts,
                "last_exit": self.last_exit, "crash_loop": crash_looping(self.exits, now),
                "since": self.started_at if up else None, "restart_at": self.due_at, "group": self.group}


class Supervisor:
    """Starts the children in order, restarts what exits, stops them in reverse."""

    def __init__(self, children: list[Child], report: Optional[Callable[[dict[str, dict]], None]] = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.children = children
        self.report = report
        self.clock = clock

    def start(self) -> None:
        """Start, in order, every child not started yet."""
        for c in self.children:
            if c.proc is None:
                c.proc, c.started_at = c.start(), self.clock()
        self._report()

    def tick(self) -> bool:
        """Restart what exited once its delay passed; True if anything changed."""
        now, changed = self.clock(), False
        for c in self.children:
            if c.due_at is None and c.proc is not None and c.proc.poll() is not None and c.planned:
                c.planned, c.due_at = False, now
            elif c.due_at is None and c.proc is not None and c.proc.poll() is not None:
                code = c.proc.returncode
                c.consecutive = 1 if now - c.started_at >= STABLE_S else c.consecutive + 1
                c.exits.append(now)
                c.last_exit = code
                c.due_at = now + restart_delay(c.consecutive)
                loop = " (crash looping)" if crash_looping(c.exits, now) else ""
                log.warning("%s exited with %s; restarting in %.1fs%s", c.name, code, c.due_at - now, loop)
                print(f"notify: {c.name} exited with {code}; restarting in {c.due_at - now:.1f}s{loop}", flush=True)
                changed = True
            if c.due_at is not None and now >= c.due_at:
                try:
                    c.proc = c.start()
                except Exception as exc:  # noqa: BLE001 - a failed start is another failure
                    c.consecutive += 1
                    c.exits.append(now)
                    c.due_at = now + restart_delay(c.consecutive)
                    print(f"notify: {c.name} did not start ({type(exc).__name__}: {exc}); "
                          f"next try in {c.due_at - now:.1f}s", flush=True)
                else:
                    c.due_at, c.started_at = None, now
                    c.restarts += 1
                    self._restart_dependents(c)
                changed = True
        if changed:
            self._report()
        return changed

    def _restart_dependents(self, c: Child) -> None:
        for d in self.children:
            if d.name in c.restart_with and d.proc is not None and d.proc.poll() is None:
                print(f"notify: restarting {d.name} with {c.name}", flush=True)
                d.planned = True
                d.proc.send_signal(signal.SIGTERM)

    def states(self) -> dict[str, dict]:
        now = self.clock()
        return {c.name: c.state(now) for c in self.children}

    def _report(self) -> None:
        if self.report is None:
            return
        try:
            self.report(self.states())
        except Exception as exc:  # noqa: BLE001 - best effort: the broker may be the one restarting
            log.debug("could not report process states: %s", exc)

    def stop(self, timeout: float = 30.0, until: Optional[Callable[[Child], bool]] = None) -> None:
        """SIGTERM the children in reverse start order, in groups: the API and the
        workers first (they release their leases while the broker still answers),
        the children ``until`` marks (the broker) last; kill what does not stop within
        ``timeout`` seconds of its group's SIGTERM (pipeline/procs.py ``stop_all``)."""
        first = [c for c in reversed(self.children) if not (until and until(c))]
        last = [c for c in reversed(self.children) if until and until(c)]
        for group in (first, last):
            stop_all([c.proc for c in group], timeout)


def redis_reporter(url: str, key: str) -> Callable[[dict[str, dict]], None]:
    """A report callback writing the states to the hash ``key`` at ``url``."""
    from pipeline.transport.client import sync_client

    host = socket.gethostname()
    client = sync_client(url, socket_timeout=1, socket_connect_timeout=1)

    fresh = {"yes": True}

    def report(states: dict[str, dict]) -> None:
        mine = {f"{host}/{name}" for name in states}
        if fresh["yes"]:  # what an earlier run on this host left
            stale = [k for k in client.hkeys(key) if k.decode(errors="replace").startswith(f"{host}/")
                     and k.decode(errors="replace") not in mine]
            if stale:
                client.hdel(key, *stale)
            fresh["yes"] = False
        client.hset(key, mapping={f"{host}/{name}": orjson.dumps({**s, "at": time.time(), "supervisor": os.getpid()})
                                  for name, s in states.items()})

    return report


def read_states(raw: dict) -> dict[str, dict]:
    """The hash ``Keys.supervisor`` as written by :func:`redis_reporter` (bad fields skipped)."""
    out = {}
    for k, v in (raw or {}).items():
        try:
            out[k.decode() if isinstance(k, bytes) else str(k)] = orjson.loads(v)
        except (orjson.JSONDecodeError, TypeError, UnicodeDecodeError):
            continue
    return out
