"""Priority topics: read and written apart from the others.

A worker reads every topic it consumes through one fetch loop and writes through
one producer queue. A deep low-priority stream then stands in front of
everything else: the loop blocks delivering into that stream's full buffer, and
the producer's next write waits behind thousands of queued low messages. The
topics in the app's ``priority_topics`` (a set of names; pipeline/topics.py
PRIORITY for the pipeline) get a fetch-and-deliver loop of their own
(:meth:`.drain.FastDrain._drain_priority`) and a producer queue of their own
(:class:`.producer.Producer`), so their latency does not depend on the depth of
any other stream. Agents of priority topics mark their task
(:func:`priority_task`), so what they send to other topics (outcomes, inflight
marks) takes the priority queue too. Ordering within a partition is kept for
each key: everything one delivery leads to is read and sent in one lane.

Separate loops are not enough to meet an OTP's latency under a deep backlog:
they still share the process's event loop and its core with the busy low
lanes, and every step of an OTP waits a pass over every busy agent. For that,
the high-priority path runs in a process of its own (pipeline/roles.py).
"""

from contextvars import ContextVar
from typing import Any

from .hooks import hooks_of

__all__ = ["MAIN", "PRIORITY", "priority_topics", "priority_task", "in_priority_task"]

#: the lanes: MAIN is Faust's own fetcher (every topic but the priority ones)
MAIN, PRIORITY = "main", "priority"


def priority_topics(app: Any) -> frozenset:
    return hooks_of(app).priority_topics


_in_priority_task: ContextVar[bool] = ContextVar("notify_priority_task", default=False)


def priority_task() -> None:
    """Mark the current task as a priority topic's agent: what it sends directly
    (its outcomes, its lane's inflight marks) is written through the priority
    queue too. Per-partition order holds: everything one delivery leads to is
    sent by agents of its own priority."""
    _in_priority_task.set(True)


in_priority_task = _in_priority_task.get
