"""A message a stream drops unhandled never counts as done (pipeline/transport/
consumer.py ``Consumer.ack``): Faust's stream acknowledges what it takes from its
queue while the flow is suspended or from an earlier generation, and counted,
that let a rebalance's commit pass an event no agent had planned (the elastic
fault drill lost an OTP written during a join). Faust's own ``ack`` and
``_new_offset`` run here; only the consumer's construction is skipped.

And a commit never passes an entry whose work is in flight (a lane's delivery handed
over in memory holds its source event: pipeline/transport/holds.py), even when the
hold is released while the commit's flush runs."""

from collections import defaultdict
from types import SimpleNamespace
from weakref import WeakSet

from faust.types import TP, ConsumerMessage
from intervaltree import IntervalTree

from pipeline.transport.consumer import Consumer
from pipeline.transport.holds import CommitHolds
from pipeline.transport.keys import Keys

TP0 = TP("notify.events.high", 3)


def _consumer() -> Consumer:
    c = Consumer.__new__(Consumer)
    c._acked, c._acked_index = defaultdict(list), defaultdict(set)
    c._committed_offset = defaultdict(lambda: None)
    c._committed_offset[TP0] = 30  # every event before 30 handled and committed
    c._unacked_messages = WeakSet()
    c._waiting_for_ack, c._n_acked = None, 0
    c._gap = defaultdict(IntervalTree)
    c._read_offset = defaultdict(lambda: None)
    c._stuck, c._reread = {}, None  # Consumer._stuck_at's bookkeeping
    # a rebalance has begun: the flow is suspended (what makes a stream drop a message)
    c.app = SimpleNamespace(topics=SimpleNamespace(acks_enabled_for=lambda topic: True),
                            flow_control=SimpleNamespace(is_active=lambda: False), consumer_generation_id=1)
    return c


def _message(offset: int, taken: bool) -> ConsumerMessage:
    m = ConsumerMessage(TP0.topic, TP0.partition, offset, 0.0, 0, [], b"k", b"v", None, 1, 1, TP0, generation_id=1)
    m.tracked = taken  # what Faust's stream sets once an agent is handed the message
    return m


def test_a_message_the_stream_dropped_does_not_move_the_committed_offset():
    c = _consumer()
    dropped = _message(30, taken=False)  # in the stream's queue when the revoke began
    assert dropped.ack(c) is False and dropped.acked
    assert c._new_offset(TP0) is None  # nothing to commit: 30 is read again
    # handled after the rebalance (the seek read it again): counted as Faust counts it
    again = _message(30, taken=True)
    assert again.ack(c) is True
    assert c._new_offset(TP0) == 31


def test_messages_an_agent_took_count_as_before():
    c = _consumer()
    for offset in (30, 31, 32):
        assert _message(offset, taken=True).ack(c) is True
    assert c._new_offset(TP0) == 33
    # one dropped in between holds the commit below it
    c = _consumer()
    _message(30, taken=True).ack(c)
    _message(31, taken=False).ack(c)
    _message(32, taken=True).ack(c)
    assert c._new_offset(TP0) == 31


def test_an_entry_that_did_not_decode_counts_as_done():
    """Faust's conductor acknowledges an entry whose key or value did not decode
    (our topics dead-letter it) without handing it to a stream: under a flowing,
    current generation that is done, and the commit passes it."""
    c = _consumer()
    c.app.flow_control = SimpleNamespace(is_active=lambda: True)
    assert _message(30, taken=False).ack(c) is True
    _message(31, taken=True).ack(c)
    assert c._new_offset(TP0) == 32
    # read in an earlier generation (a stream drops it): not done
    c = _consumer()
    c.app.flow_control = SimpleNamespace(is_active=lambda: True)
    c.app.consumer_generation_id = 2
    assert _message(30, taken=False).ack(c) is False
    assert c._new_offset(TP0) is None


def test_no_commit_passes_the_entry_at_the_committed_offset():
    """Faust lets a commit pass one unacknowledged entry at the committed offset
    (``min(acked) - committed > 1``); the elastic drill lost an event so (committed
    36, then 85). Here nothing is committable until that entry is done or a gap."""
    c = _consumer()  # committed 30
    for offset in (31, 32):
        _message(offset, taken=True).ack(c)
    assert c._new_offset(TP0) is None  # 30 is still being handled (or was dropped)
    _message(30, taken=True).ack(c)
    assert c._new_offset(TP0) == 33
    c = _consumer()
    c._gap[TP0].addi(30, 31)  # an offset the drain took for a gap counts as done, as in Faust
    _message(31, taken=True).ack(c)
    assert c._new_offset(TP0) == 32


class _Commits(Consumer):
    """The consumer's commit path with its Redis script replaced by a list."""

    def __init__(self) -> None:  # noqa: D107 - the state the commit path reads, as _consumer builds it
        base = _consumer()
        self.__dict__.update(base.__dict__)
        self.app.flow_control = SimpleNamespace(is_active=lambda: True)
        self.app.conf = SimpleNamespace(id="notify")
        self.transport = SimpleNamespace(keys=Keys())
        self.holds = CommitHolds()
        self._behind, self._caps = {}, {}
        self._assigned = {TP0}
        self.written: list[int] = []

    def _commit_fence(self, tp):
        return b"token", "m1:1"

    async def _commit_part(self, group, partition, args):
        self.written.append(args[1])
        return True

    async def commit_once(self) -> None:
        """Faust's order: the offsets taken, then the flush (during which ``during``
        runs), then the commit; Faust counts what it took as committed."""
        offsets = self._filter_committable_offsets([TP0])
        self.during()
        if offsets:
            await self._commit(offsets)
            self._committed_offset.update(offsets)

    def during(self) -> None:
        pass


async def test_a_hold_released_during_the_flush_keeps_the_commit_below_it_until_the_next():
    """A delivery handed to a lane in memory holds its source event's offset until
    it is done; done while the commit's flush runs (its records added after the
    flush began, so not in this commit's writes), the commit must still stop at the
    source (the offsets were taken with the hold), and the next commit reaches what
    Faust already counts as committed, with no new acknowledgement."""
    c = _Commits()
    c.holds.hold(TP0, 30)  # the source event at 30, its delivery in a lane's slot
    for offset in (30, 31, 32):
        _message(offset, taken=True).ack(c)
    c.during = lambda: c.holds.release(TP0, 30)  # the delivery is done during the flush
    await c.commit_once()
    assert c.written == [30] and c._behind == {TP0: 33}
    c.during = lambda: None
    await c.commit_once()  # nothing new acknowledged: the target still goes out
    assert c.written == [30, 33] and c._behind == {}
    await c.commit_once()
    assert c.written == [30, 33]  # and then nothing more


async def test_a_hold_kept_past_the_flush_stops_commits_until_released():
    c = _Commits()
    c.holds.hold(TP0, 31)
    for offset in (30, 31, 32):
        _message(offset, taken=True).ack(c)
    await c.commit_once()
    await c.commit_once()
    assert c.written == [31, 31] and c._behind == {TP0: 33}
    c.holds.release(TP0, 31)
    await c.commit_once()
    assert c.written == [31, 31, 33] and c._behind == {}
