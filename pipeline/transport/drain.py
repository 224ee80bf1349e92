"""The hand-off from fetched records to the streams, without Faust's per-message costs.

Faust's ``Consumer._drain_messages`` delivers each message with
``wait_first(callback(message), suspend_flow.wait())``: four tasks created and
three cancelled for every message, so the callback can be abandoned if a
rebalance suspends the flow while it is blocked. Profiled, that was the largest
single cost of a stateless agent on this transport.

The callback (``Conductor.on_message``) can only block in two places: on the
flow-control gate, which is closed during a rebalance, and on a stream buffer
that is full. So :class:`FastDrain` awaits the callback directly in steady
state, and falls back to Faust's ``wait_first`` whenever a rebalance is under
way or the flow is suspended or gated. (Awaiting it directly across a rebalance
lost deliveries: with two workers and eight partitions, pre-written input
stalled with some messages never acked: tests/transport/test_elastic.py.)
A put blocked on a full buffer is released by the rebalance itself: clearing
the flow-control queues cancels their waiting putters, and a delivery that
still lands after the rebalance carries the old generation and is skipped by
the stream, exactly as with Faust's own loop.

A seek (Faust seeks to the committed offsets at the end of every recovery, while
the fetcher already runs) moves the read positions back: the rest of a batch
fetched before it is dropped, not delivered, and what was delivered past the new
position is delivered again (``Consumer.seek_to_committed`` resets the read
offsets). Deliveries that raced the recovery were otherwise skipped by the
streams and acknowledged, i.e. lost (tests/pipeline/test_startup_backlog.py).
A delivery whose callback was still waiting when a rebalance came must not
then record its offset as the last one delivered: the streams drop it (old
generation), and everything the rebalance's seek reads again below it would be
skipped as a duplicate, never handled nor acknowledged, and the partition's
commit would stall there for good (seen under a profiler, which slowed a worker
into a rebalance; tests/transport/test_drain.py). After a seek within a
generation (the end of a recovery), what a delivery waiting across it had
delivered stays delivered: the streams handle it from their buffers (below), and
reading it again would handle it twice.

What the streams' buffers hold at the end of a recovery stays there. Faust
resumes the partitions, seeks to the committed offsets, then resumes the flow
once more, and ``FlowControlEvent.resume()`` clears every stream buffer, flowing
or not. The fetcher runs during the seek (its reads take a round trip or more)
and delivers from the positions the rebalance set; the clear then dropped those
deliveries. Read again after the seek, most came back; but a delivery whose
callback waited across the seek (a full buffer) set the read offset to its own,
and the entries the clear had dropped below it were skipped as delivered: never
handled nor acknowledged, the partition's commit stuck below them for good, and
the work of a takeover lost (the kill -9 drill lost OTPs so). So the app's flow
control clears the buffers only when it resumes a suspended flow
(:class:`KeepOnResume`, set by :func:`keep_buffers_on_resume`): what the last
resume finds was read in the current generation and is handled, once from the
buffer and, when the seek read it again, once more as a replay.

Faust also pauses a partition whose stream buffer is under pressure, and when
every assigned partition is paused its fetcher sleeps a whole second before
looking again, even if the buffers drained after a few milliseconds. Here the
fetcher waits for the first partition to come back instead.
"""

import asyncio
from typing import Any, AsyncIterator, Iterable, Optional, Set, Tuple, cast

from faust.types import TP
from mode.utils.queues import FlowControlEvent

from .priority import MAIN, PRIORITY

__all__ = ["FastDrain", "KeepOnResume", "keep_buffers_on_resume"]


class KeepOnResume(FlowControlEvent):
    """Faust's flow control, except that resuming a flow that is not suspended
    keeps the stream buffers (module docstring: the end of a recovery)."""

    def resume(self) -> None:
        if self.is_active():
            return
        super().resume()


def keep_buffers_on_resume(flow_control: Any) -> None:
    """Make the app's flow control a :class:`KeepOnResume` (its queues and events
    kept: the stream buffers already made hold it)."""
    if type(flow_control) is FlowControlEvent:
        flow_control.__class__ = KeepOnResume


class FastDrain:
    """Mixin for a ``faust.transport.consumer.Consumer`` subclass."""

    _flow_ready: asyncio.Event

    def _init_drain(self) -> None:
        self._flow_ready = asyncio.Event()

    # -- pausing partitions whose buffers are full --------------------------

    def on_buffer_drop(self, tp: TP) -> None:
        super().on_buffer_drop(tp)  # type: ignore[misc]
        self._flow_ready.set()

    def resume_partitions(self, tps: Iterable[TP]) -> None:
        super().resume_partitions(tps)  # type: ignore[misc]
        self._flow_ready.set()

    async def _wait_resumed(self, timeout: float) -> None:
        """Until a paused partition resumes, or ``timeout`` seconds."""
        self._flow_ready.clear()
        try:
            await asyncio.wait_for(self._flow_ready.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def _wait_next_records(self, timeout: float) -> Tuple[Optional[dict], Optional[Set[TP]]]:
        this: Any = self
        if this.flow_active and not this.app.client_only and not this._get_active_partitions():
            # every partition paused: wait for one to resume, not a fixed second
            await self._wait_resumed(timeout)
            active = this._get_active_partitions()
            if not active:
                return {}, active
        return await super()._wait_next_records(timeout)  # type: ignore[misc]

    # -- delivering ---------------------------------------------------------

    async def _drain_messages(self, fetcher: Any) -> None:  # pragma: no cover - runs in the worker
        """Faust's fetcher task: this delivers every topic but the priority ones, and
        runs the priority drain beside it while it runs."""
        this: Any = self
        prio = asyncio.ensure_future(self._drain_priority(fetcher)) if this._priority_topics else None
        if prio is not None:
            # a failed priority drain crashes the consumer (and the worker) as a failed
            # main drain does, instead of leaving the priority topics unread
            prio.add_done_callback(
                lambda f: f.cancelled() or f.exception() is None or asyncio.ensure_future(this.crash(f.exception())))
        try:
            await self._drain(fetcher, this.getmany, MAIN)
        finally:
            if prio is not None:
                prio.cancel()
                try:
                    await prio
                except BaseException:
                    pass

    async def _drain_priority(self, fetcher: Any) -> None:  # pragma: no cover - runs in the worker
        """The priority topics' own fetch-and-deliver loop.

        One loop for every topic blocks on the slowest stream: a delivery into a
        full buffer (a low lane working through a backlog, 100 deliveries per
        batch) waits until that agent takes its next batch, and everything fetched
        after it (an OTP) waits too. The priority topics (the hooks' ``priority_topics``:
        pipeline/topics.py PRIORITY) get a read of their own (its own connection
        from the pool, so an XREAD BLOCK wakes the moment one is written) and a
        delivery loop of their own, so no low-priority stream stands in front of
        them. The producer writes them apart as well (``Producer``)."""
        await self._drain(fetcher, self._getmany_priority, PRIORITY)

    async def _getmany_priority(self, timeout: float) -> AsyncIterator[Tuple[TP, Any]]:
        """Faust's ``getmany`` for the priority lane: one read of the active priority
        partitions, yielded while the flow is on and the generation unchanged; what
        is not yielded is read again (:meth:`Consumer.unread`)."""
        this: Any = self
        if not this.flow_active:
            await this.wait(this.can_resume_flow)
        prio = this._priority_topics
        tps = [tp for tp in this._get_active_partitions() if tp.topic in prio]
        records = await this._fetch(tps, timeout, PRIORITY)
        generation_id = this.app.consumer_generation_id
        to_message = this._to_message
        stop = False
        for tp, recs in records.items():
            for rec in recs:
                stop = stop or not this.flow_active or generation_id != this.app.consumer_generation_id
                if stop:
                    this.unread(tp, rec.offset, PRIORITY)
                    break
                yield tp, to_message(tp, rec)

    async def _drain(self, fetcher: Any, getmany: Any, lane: str) -> None:  # pragma: no cover - runs in the worker
        this: Any = self
        callback = this.callback
        consumer_should_stop = this._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        suspended = this.suspend_flow.is_set
        read_offset = this._read_offset
        acks_enabled_for = this.app.topics.acks_enabled_for
        commit_every = this._commit_every
        sleep = asyncio.sleep
        app = this.app
        batch_is_current = this.batch_is_current
        generation_is_current = this.batch_generation_is_current
        fc_active = app.flow_control.is_active
        yield_every = 100
        since_yield = 0
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                ait = cast(AsyncIterator, getmany(timeout=1.0))
                await sleep(0)
                if this.should_stop:
                    break
                async for tp, message in ait:
                    since_yield += 1
                    if since_yield > yield_every:
                        await sleep(0)
                        since_yield = 0
                    if not batch_is_current(lane):
                        continue  # a seek since this batch was fetched: it is read again from there
                    offset = message.offset
                    r_offset = read_offset.get(tp)
                    if r_offset is not None and offset < r_offset:
                        continue  # already delivered (a re-read after a seek)
                    if r_offset and offset - r_offset > 1 and acks_enabled_for(message.topic):
                        await this._add_gap(tp, r_offset + 1, offset)
                    if commit_every is not None and this._n_acked >= commit_every:
                        this._n_acked = 0
                        await this.commit()
                    if suspended() or app.rebalancing or not fc_active():
                        await this.wait_first(callback(message), this.suspend_flow.wait())
                    else:
                        await callback(message)
                    if generation_is_current(lane):
                        read_offset[tp] = offset
                    # else a rebalance came while the callback waited (on flow
                    # control, on the producer): the streams drop this delivery (old
                    # generation), so keep the read offset the rebalance's seek set,
                    # or what it reads again up to here is taken for delivered and
                    # never handled nor acked
        except asyncio.CancelledError:
            if this.transport.app.should_stop:
                return
            raise
        except Exception as exc:
            this.log.exception("Drain messages raised: %r", exc)
            raise
