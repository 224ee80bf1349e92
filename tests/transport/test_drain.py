"""FastDrain's hand-off across a seek (unit test of the drain loop's bookkeeping:
the consumer around it is a stand-in; the real consumer's seeks are exercised
end to end in tests/pipeline/test_startup_backlog.py)."""

import asyncio
from types import SimpleNamespace

from faust.types import TP

from pipeline.transport.drain import FastDrain
from pipeline.transport.priority import MAIN

TP0 = TP("t", 0)


class _Drain(FastDrain):
    """The attributes ``FastDrain._drain`` reads off a Faust consumer."""

    def __init__(self, batches: list[list[int]], block_on: int) -> None:
        self._init_drain()
        self.batches = batches
        self.block_on = block_on
        self.release = asyncio.Event()
        self.blocked = asyncio.Event()
        self.delivered: list[int] = []
        self._read_offset: dict = {}
        self._commit_every = None
        self._n_acked = 0
        self._stopped = asyncio.Event()
        self.suspend_flow = asyncio.Event()
        self.should_stop = False
        self.stamp = (0, 0)  # (epoch, generation) of the last batch fetched
        self.epoch = 0
        self.generation = 0
        self.app = SimpleNamespace(
            topics=SimpleNamespace(acks_enabled_for=lambda topic: True),
            rebalancing=False,
            flow_control=SimpleNamespace(is_active=lambda: True),
        )

    def batch_is_current(self, lane: str = MAIN) -> bool:
        return self.stamp == (self.epoch, self.generation)

    def batch_generation_is_current(self, lane: str = MAIN) -> bool:
        return self.stamp[1] == self.generation

    async def getmany(self, timeout: float):
        if not self.batches:
            self._stopped.set()
            return
        self.stamp = (self.epoch, self.generation)
        for offset in self.batches.pop(0):
            yield TP0, SimpleNamespace(offset=offset, topic=TP0.topic)

    async def callback(self, message) -> None:
        if message.offset == self.block_on and not self.blocked.is_set():
            self.blocked.set()
            await self.release.wait()  # e.g. on flow control, or a full producer buffer
        self.delivered.append(message.offset)

    def seek(self, offset: int, rebalance: bool) -> None:
        """What Consumer.seek_to_committed does to the drain's state (after a
        rebalance, with a new generation)."""
        self._read_offset[TP0] = offset
        self.epoch += 1
        self.generation += rebalance


async def _run(d: _Drain, rebalance: bool) -> None:
    task = asyncio.ensure_future(d._drain(SimpleNamespace(_stopped=asyncio.Event()), d.getmany, MAIN))
    await asyncio.wait_for(d.blocked.wait(), 5)
    d.seek(10, rebalance)
    d.release.set()
    await asyncio.wait_for(task, 5)


async def test_a_rebalance_while_a_delivery_waits_is_not_undone_by_it():
    # 10..12 fetched; 11's delivery waits; meanwhile a rebalance seeks back to the
    # committed offset 10, and the read from there returns 10..13 again
    d = _Drain([[10, 11, 12], [10, 11, 12, 13]], block_on=11)
    await _run(d, rebalance=True)
    # 12 of the stale batch is dropped, and the re-read delivers from 10 again (the
    # streams drop the old generation's 10 and 11): before the fix, 11's late
    # bookkeeping made 10..11 look delivered (never handled nor acked, the
    # partition's commit stuck below them)
    assert d.delivered == [10, 11, 10, 11, 12, 13]
    assert d._read_offset[TP0] == 13



async def test_a_seek_within_the_generation_delivers_nothing_twice():
    # the end of a recovery: same generation, the streams handle what was delivered
    d = _Drain([[10, 11, 12], [10, 11, 12, 13]], block_on=11)
    await _run(d, rebalance=False)
    assert d.delivered == [10, 11, 11, 12, 13]  # 11 again: Faust's ">= read offset"


def test_the_flow_control_clears_the_buffers_only_when_it_resumes_a_suspended_flow():
    # the end of a recovery resumes a flow that already runs: what the buffers hold
    # was read in this generation (pipeline/transport/drain.py KeepOnResume)
    from mode.utils.queues import FlowControlEvent, FlowControlQueue

    from pipeline.transport.drain import KeepOnResume, keep_buffers_on_resume

    fc = FlowControlEvent()
    keep_buffers_on_resume(fc)
    assert isinstance(fc, KeepOnResume)
    q: FlowControlQueue = FlowControlQueue(flow_control=fc, clear_on_resume=True)
    fc.resume()  # suspended at first: cleared as before
    q.put_nowait(1)
    fc.resume()  # flowing: kept
    assert q.qsize() == 1 and fc.is_active()
    fc.suspend()
    fc.resume()  # a rebalance's suspension: cleared as before
    assert q.qsize() == 0 and fc.is_active()
