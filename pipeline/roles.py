"""Worker roles: which agents a worker process runs (``create_app(settings, role)``;
``notify worker --role``, or ``NOTIFY_ROLE`` read into ``settings.env.role``).

``all`` (the default) runs every agent. For OTPs that never wait behind a
backlog, run the high-priority path in a process of its own:

    NOTIFY_ROLE=main      every agent but the high-priority path (N processes)
    NOTIFY_ROLE=priority  expand.high, guard.high and the lane.*.high agents (1 process)

Inside one process the priority topics already have their own fetch loop and
producer queue (pipeline/transport/priority.py), but they share its event loop
and its core with the low lanes: under a deep backlog every step of an OTP
waits one pass over every busy agent. In a process of its own, the high path
sleeps until an OTP comes. So that the OS also runs it ahead of the busy
workers when the cores are short, a ``main`` worker lowers its own CPU priority
at start: ``SCHED_IDLE`` (``NOTIFY_MAIN_SCHED``: ``idle``, ``batch`` or
``normal``), and ``nice`` +10 for the classes that use it (``NOTIFY_MAIN_NICE``;
0 keeps it). The kernel then gives a woken priority worker, Redis and the API
the core first, and the main workers every cycle they leave. Nice alone was not
enough once a main worker kept two threads busy (its event loop and its SQLite
writer, agents/sink.py): OTP p99 under a 100,000 backlog went from about 20 ms
to 35-79 ms, and back to 24-44 ms (four runs) with ``SCHED_IDLE``
(bench/RESULTS.md "otp-priority"). The writer thread itself keeps the ordinary
class with the nice increment (pipeline/threads.py): it holds SQLite's write
lock, which the priority worker's writes share, and must not be starved while it
holds it.

Switching a deployment between ``all`` and ``main`` + ``priority`` (either way):
stop the old workers, start the new ones. The group that takes over the
priority topics starts from where the other stopped (:func:`offset_peers`).

The priority role is a consumer group of its own (app id ``notify-priority``),
so it has tables of its own, all partitions in one process: its dedup keys,
daily counters and inflight marks are those of high-priority deliveries only
(no other role writes such keys), and it keeps its own copy of preferences and
devices from notify.preferences / notify.devices, which both roles read. It
writes the records of its own outcomes (agents/sink.py); its outcomes and dead
letters go to the shared topics. Its timers (retries and reconciliations of high
deliveries, deferred high intents) go to notify.timers.high, which it holds and
fires itself; the main role handles notify.timers and the receipts.
"""

import logging
import os

from config.environment import ROLES, SCHED_CLASSES

from . import threads
from .topics import DEVICES, PREFERENCES, PRIORITY

__all__ = ["GROUPS", "ROLES", "SCHED_CLASSES", "SHARED", "app_id", "runs", "offset_peers", "lower_priority"]

log = logging.getLogger(__name__)

#: topics whose agents every role runs (each role keeps its own tables of them)
SHARED = frozenset([PREFERENCES, DEVICES])


def runs(topic: str, role: str) -> bool:
    """Whether a worker of ``role`` runs the agent reading ``topic``: the priority
    role those of the priority topics (pipeline/topics.py PRIORITY, the same set the
    transport reads and writes apart), the main role the others."""
    if role == "all" or topic in SHARED:
        return True
    return (topic in PRIORITY) == (role == "priority")


def app_id(role: str) -> str:
    """The Faust app id (= consumer group, and the prefix of the tables' changelogs)."""
    return "notify-priority" if role == "priority" else "notify"


#: the consumer groups of the default layout (`notify run`): the main role's and the priority role's
GROUPS = (app_id("main"), app_id("priority"))


def offset_peers(role: str) -> dict[str, tuple[str, ...]]:
    """Topic → the other consumer group that reads it when the deployment runs the
    other way (``app.offset_peers``, used by the transport's consumer when it seeks
    to its committed offsets). The priority topics are read by ``notify`` while
    workers run ``all`` and by ``notify-priority`` once they run ``main`` +
    ``priority``: a group starts such a partition from the furthest of its own and
    the other's committed offsets, so a switch either way goes on where the other
    group stopped instead of sending retained OTPs again."""
    other = app_id("all") if app_id(role) == app_id("priority") else app_id("priority")
    return {topic: (other,) for topic in PRIORITY}


def lower_priority(role: str, nice: int = 10, sched: str = "idle") -> int:
    """Lower this process's CPU priority if it is a ``main`` worker: the nice
    increment and the scheduling class, for every thread it has (Linux keeps both
    per thread; threads started later inherit them), except the class of the
    starter thread (pipeline/threads.py), which starts the threads that hold a lock
    the other workers wait for. Returns the increment taken (0 for the other roles)."""
    if role != "main":
        return 0
    nice = max(0, nice)
    policy = SCHED_CLASSES[sched]
    # the lock holders (the record store's writer) are started by this thread, which
    # keeps the ordinary class: never starved while they hold SQLite's write lock
    starter = threads.prepare_starter()
    for tid in _threads():
        try:
            if nice:
                os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
            if policy is not None and tid != starter:
                os.sched_setscheduler(tid, getattr(os, policy), os.sched_param(0))
        except (OSError, AttributeError) as exc:  # a thread gone meanwhile; a platform without the class
            log.warning("could not lower the priority of thread %d: %s", tid, exc)
    return nice


def _threads() -> list[int]:
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]  # not Linux: this thread
