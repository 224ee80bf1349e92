"""How far this worker applied the user updates (notify.preferences,
notify.devices) of each partition, so that the guard does not decide on a
profile older than the event.

The updates and the events are separate streams, read by separate loops (an
OTP's on the priority fetch loop, the updates on the ordinary one), so an event
written just after its user's update (a sign-up sets the phone number, then asks
for an OTP) can be planned before the update is applied, and the OTP ends
FILTERED ``unreachable``: under ``notify demo`` a quarter of the high-priority
notifications were, while the priority worker was still applying the demo's
2,000 profiles.

:meth:`Applied.wait` is the guard's read barrier, used when a plan turns a
channel down for want of an address or for an opt-out (the only decisions a
pending update can turn into a send; a pending opt-out is caught again by the
lanes' re-check just before the call): it reads the partitions' ends (one
``MGET``) and waits, at most ``timeout`` seconds, until this worker's agents
applied every update written before then; the guard then plans again. A
partition found caught up at a time needs no check for events accepted before it
(less half a second for the clocks of other hosts).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Optional

from faust.types import TP

from pipeline.topics import DEVICES, PREFERENCES
from pipeline.transport.client import TRANSIENT_ERRORS
from pipeline.transport.committed import read as read_committed

__all__ = ["Applied"]

log = logging.getLogger(__name__)

#: how far apart two hosts' clocks may be when an event's time is compared with a check's
SKEW_S = 0.5
#: how often the barrier looks again while it waits
POLL_S = 0.005
#: how soon a read the broker refused (a transient error) is tried again
RETRY_S = 0.1
#: after a wait that timed out (the updates lag far behind: a bulk import), the
#: partition's events are planned without waiting for this long
LAGGING_S = 10.0

TOPICS = (PREFERENCES, DEVICES)


class Applied:
    """The read barrier of one app (:meth:`wait`), fed by the update agents (:meth:`mark`)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        #: next offset to apply per partition of the update topics (what the agents handled)
        self.applied: dict[TP, int] = {}
        #: what was committed when the partition was assigned (applied before: the table recovered it)
        self._base: dict[TP, int] = {}
        #: partition → when it was last found caught up
        self._fresh_at: dict[int, float] = {}
        #: partition → until when it is not waited for (a wait timed out)
        self._lagging: dict[int, float] = {}
        self.waits = 0

    def mark(self, message: Any) -> None:
        """An update handled (applied, or refused) by the preferences or devices agent."""
        tp = message.tp
        if message.offset + 1 > self.applied.get(tp, -1):
            self.applied[tp] = message.offset + 1

    def on_rebalance(self) -> None:
        self._base.clear()
        self._fresh_at.clear()

    async def _applied(self, tps: list) -> list[int]:
        missing = [tp for tp in tps if tp not in self._base]
        if missing:
            transport = self.app.transport
            client = await transport.client()
            got = await read_committed(client, transport.keys, self.app.conf.id, missing)
            self._base.update({tp: c or 0 for tp, c in zip(missing, got)})
        return [max(self.applied.get(tp, 0), self._base[tp]) for tp in tps]

    #: longest a plan waits for the updates (then it is made with the table as it is)
    timeout_s = 3.0

    async def wait(self, partition: int, since: float, timeout: Optional[float] = None) -> bool:
        """Wait until this worker applied the updates of ``partition`` written before
        now, for an event accepted at ``since``. True when some were pending (then the
        caller plans again), False when none were, or when the wait timed out (then
        the partition is not waited for during :data:`LAGGING_S`: a backlog of updates
        must not hold every event for ``timeout``)."""
        if since and since < self._fresh_at.get(partition, 0.0) - SKEW_S:
            return False
        if time.monotonic() < self._lagging.get(partition, 0.0):
            return False
        started = time.time()
        tps = [TP(t, partition) for t in TOPICS]
        ends: Optional[Any] = None
        waited = False
        deadline = time.monotonic() + (self.timeout_s if timeout is None else timeout)
        while True:
            try:
                if ends is None:
                    ends = await self.app.consumer.highwaters(*tps)
                done = await self._applied(tps)
            except TRANSIENT_ERRORS as exc:
                # the broker away for a moment (a master failing over): asked again
                # until the deadline, then the plan is made with the table as it is,
                # as after a timeout; the guard never crashes on it
                if time.monotonic() > deadline:
                    log.warning("read barrier of partition %d: the broker did not answer (%s); planning "
                                "with the preferences as they are", partition, exc)
                    self._lagging[partition] = time.monotonic() + LAGGING_S
                    return False
                await asyncio.sleep(RETRY_S)
                continue
            if all(d >= ends[tp] for d, tp in zip(done, tps)):
                self._fresh_at[partition] = started
                return waited
            if time.monotonic() > deadline:
                self._lagging[partition] = time.monotonic() + LAGGING_S
                return False
            if not waited:
                waited = True
                self.waits += 1
            await asyncio.sleep(POLL_S)

    async def _rebalanced(self, sender: Any, **kwargs: Any) -> None:
        self.on_rebalance()


def attach(app: Any) -> Applied:
    """The barrier of ``app``, told of every rebalance and of every update entry that
    never reaches its agent (malformed: dead-lettered by the topic, pipeline/entries.py),
    so that a bad entry does not hold the barrier until its timeout."""
    applied = Applied(app)
    app.on_rebalance_complete.connect(applied._rebalanced)
    for topic in (app.declared.preferences, app.declared.devices):
        topic.schema.on_skip = applied.mark
    return applied
