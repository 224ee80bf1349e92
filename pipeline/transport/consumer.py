"""Consumer: XREAD BLOCK over the assigned partitions, offsets committed in a
hash per group, rebalances driven by slot leases through Faust's callbacks.

On Redis Cluster a multi-key XREAD must stay within one hash slot, and every
partition has its own hash tag, so the streams are read per slot (see
:meth:`Consumer._xread_cluster`).
"""

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Optional, Set

from faust.assignor.client_assignment import ClientAssignment
from faust.transport import consumer as base
from faust.types import TP, ConsumerMessage
from mode import Service
from redis.exceptions import ResponseError

from .client import TRANSIENT_ERRORS
from .compactor import Schedule, compact_partition
from .drain import FastDrain, keep_buffers_on_resume
from .holds import CommitHolds
from .integrity import REWRITE_COMMITTED, Verdict, check, rewrite_committed, stream_end
from .keys import offset_of
from .ownership import SlotLeases
from .priority import MAIN, PRIORITY, priority_topics
from .retention import READER_TTL_S, Horizons, trim_horizon, trim_partition
from .committed import read as read_committed
from .scripts import COMMIT_PART, SET_COMMIT_FENCE, SET_FENCE
from .hooks import hooks_of

if TYPE_CHECKING:
    from . import Transport

__all__ = ["Consumer", "MALFORMED", "Record"]

log = logging.getLogger(__name__)


class Record(NamedTuple):
    offset: int
    timestamp: float
    key: Optional[bytes]
    value: Optional[bytes]
    headers: list


#: header name of a record whose transport fields could not be decoded (the reason
#: is its value): no producer of this transport writes it (a header named this way
#: by hand only gets its own entry dead-lettered). The agents' topics refuse such a
#: record before decoding anything (pipeline/entries.py ``GuardedSchema``), so one
#: malformed entry is dead-lettered and its partition goes on, instead of crashing
#: the fetcher (and the worker) on every restart.
MALFORMED = "\x00malformed"


def _decode(entry_id: bytes, fields: list) -> Record:
    """One entry of a raw XREAD reply: its id and its flat [name, value, ...] list.
    Never raises: an entry whose fields are not this transport's comes back marked
    :data:`MALFORMED`, with what could be read of its key and value."""
    key = value = None
    ts = 0.0
    headers = []
    it = iter(fields)
    try:
        for name, val in zip(it, it):
            if name == b"v":
                value = val
            elif name == b"k":
                key = val
            elif name == b"t":
                ts = float(val)
            elif name[:2] == b"h:":
                headers.append((name[2:].decode(), val))
        if len(fields) % 2:
            raise ValueError("an odd number of fields")
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        return _malformed(entry_id, fields, f"{type(exc).__name__}: {exc}")
    return Record(offset_of(entry_id), ts, key, value, headers)


def _malformed(entry_id: bytes, fields: list, why: str) -> Record:
    raw = dict(zip(fields[::2], fields[1::2]))
    key, value = raw.get(b"k"), raw.get(b"v")
    return Record(offset_of(entry_id), 0.0, key if isinstance(key, bytes) else None,
                  value if isinstance(value, bytes) else None, [(MALFORMED, why[:300].encode())])


class _Read(NamedTuple):
    """An outstanding XREAD BLOCK on one hash slot (Redis Cluster only)."""

    task: "asyncio.Future[Any]"
    want: frozenset  # {(stream key, after id), ...}
    stamp: tuple[int, int]  # (epoch, generation) when issued


def _retrieve(task: "asyncio.Future[Any]") -> None:
    # a replaced read's error is nobody's business; don't log it as unretrieved
    if not task.cancelled():
        task.exception()


#: while a partition is paused on a full buffer: how often the others are polled
PAUSED_POLL_S = 0.005
#: seconds a partition's commit may wait for the entry at its committed offset once
#: that entry was read, no stream holds it and later ones are done, before the
#: partitions are read again from their committed offsets (:meth:`Consumer._stuck_at`)
REREAD_AFTER_S = 30.0


class Consumer(FastDrain, base.Consumer):
    transport: "Transport"
    consumer_stopped_errors = ()

    def __init__(self, transport: Any, *args: Any, **kwargs: Any) -> None:
        self._subscription: set[str] = set()
        self._assigned: set[TP] = set()
        self._pos: dict[TP, int] = {}
        self._hw: dict[TP, int] = {}
        self._epoch = 0
        self._generation = 0
        self._key_tp: dict[bytes, TP] = {}  # stream key -> partition (replies)
        self._tp_key: dict[TP, str] = {}  # partition -> stream key (reads)
        self._rebalance_wanted = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self._commit_script: Any = None
        self._fence_script: Any = None
        self._rewrite_script: Any = None  # integrity.REWRITE_COMMITTED, registered on first use
        self._key_slot: dict[str, int] = {}
        self._reads: dict[str, dict[int, _Read]] = {}  # lane -> hash slot -> outstanding read
        self._batch_stamps: dict[str, tuple[int, int]] = {}  # lane -> (epoch, generation) of its last batch
        self._replaced: set[Any] = set()
        #: offsets still being worked on (a lane's calls in flight): commits stop below them
        self.holds = CommitHolds()
        #: partition → the offset Faust counts as committed, which a hold kept the
        #: committed offset below (committed again until it gets there)
        self._behind: dict[TP, int] = {}
        #: the holds read with the offsets of the commit under way
        self._caps: dict[TP, int] = {}
        #: partition → (committed offset, since when) its commit waits for that entry
        self._stuck: dict[TP, tuple[int, float]] = {}
        self._reread: Optional[asyncio.Future] = None
        opts = transport.options
        self._compaction = Schedule()
        self._horizons = Horizons(opts.keep_s)
        self.leases = SlotLeases(
            transport.keys,
            transport.app.conf.id,
            opts.slots,
            lease_s=opts.lease_s,
            preferred=opts.slot,
            max_slots=opts.max_slots,
            takeover_grace_s=opts.takeover_grace_s,
        )
        transport.leases = self.leases
        self._init_drain()
        super().__init__(transport, *args, **kwargs)
        keep_buffers_on_resume(self.app.flow_control)
        self._max_records = self.app.conf.broker_max_poll_records or 1000
        self._priority_topics = priority_topics(self.app)

    def _get_active_partitions(self) -> set:
        # Faust's, without its assert that walks every assigned partition on each
        # call (a fetch and a delivery loop call it every round)
        tps = self._active_partitions
        if tps is None:
            return self._set_active_tps(self.assignment())
        return tps

    # -- lifecycle ---------------------------------------------------------

    async def on_start(self) -> None:
        client = await self.transport.client()
        self._register_scripts(client)
        await self._tick_leases()

    def _register_scripts(self, client: Any) -> None:
        self._commit_script = client.register_script(COMMIT_PART)
        self._commit_fence_script = client.register_script(SET_COMMIT_FENCE)
        self._fence_script = client.register_script(SET_FENCE)

    async def on_stop(self) -> None:
        self._cancel_reads()
        await super().on_stop()
        try:
            await self.leases.release_all(await self.transport.client())
        except TRANSIENT_ERRORS as exc:  # pragma: no cover - best effort
            log.warning("could not release leases: %s", exc)

    @Service.task
    async def _heartbeat(self) -> None:
        interval = self.leases.lease_ms / 1000 / 3
        while not self.should_stop:
            await self.sleep(interval)
            try:
                await self._tick_leases()
            except TRANSIENT_ERRORS as exc:
                log.warning("lease heartbeat failed: %s", exc)

    async def _tick_leases(self) -> None:
        gained, lost = await self.leases.tick(await self.transport.client())
        if gained or lost:
            self._rebalance_wanted.set()

    def on_fenced(self, partition: int) -> None:
        """A fenced write was refused: stop treating the slot as ours."""
        slot = self.leases.slot_of(partition)
        if slot in self.leases.owned:
            log.warning("fenced on slot %d: another worker owns it now", slot)
            self.leases.drop(slot)
            self._rebalance_wanted.set()

    @Service.task
    async def _rebalancer(self) -> None:
        # Runs apart from subscribe(): rebalancing inside subscribe deadlocks on
        # topics.maybe_wait_for_subscriptions().
        while not self.should_stop:
            await self._rebalance_wanted.wait()
            self._rebalance_wanted.clear()
            try:
                await self._rebalance()
            except TRANSIENT_ERRORS as exc:
                log.warning("rebalance failed (%s); retrying", exc)
                await self.sleep(0.5)
                self._rebalance_wanted.set()

    @Service.task
    async def _compactor(self) -> None:
        interval = self.transport.options.compact_interval_s
        if not interval:
            return
        while not self.should_stop:
            await self.sleep(interval)
            await self.compact()
            try:
                await self.trim()
            except TRANSIENT_ERRORS as exc:
                log.warning("trimming failed: %s", exc)

    async def compact(self, force: bool = False) -> int:
        """Compact the changelog partitions this worker owns that are due (all
        with ``force``); returns the number of entries deleted."""
        client = await self.transport.client()
        opts, keys = self.transport.options, self.transport.keys
        changelogs = self.app.tables.changelog_topics
        removed = 0
        for tp in sorted(self._assigned):
            if tp.topic not in changelogs:
                continue
            try:
                length = await client.xlen(keys.stream(tp.topic, tp.partition))
                if not force and not self._compaction.due(tp, length, time.time()):
                    continue
                plan = await compact_partition(
                    client, keys, tp.topic, tp.partition,
                    retention_s=self.transport.retention(tp.topic),
                    tombstone_grace_s=opts.tombstone_grace_s,
                )
                self._compaction.done(tp, plan)
                removed += len(plan.doomed)
            except TRANSIENT_ERRORS as exc:
                log.warning("compaction of %s failed: %s", tp, exc)
        return removed

    async def trim(self) -> int:
        """Trim the consumed (non-changelog) topic partitions this worker owns
        below what every reader group has committed (see :mod:`.retention`), and
        the partitions it owns of the topics the app only writes
        (``trim_written`` of the transport hooks) below what every other reader group has committed,
        or by age alone when no group reads them."""
        keep = self.transport.options.keep_s
        if keep < 0:
            return 0
        client = await self.transport.client()
        keys = self.transport.keys
        changelogs = self.app.tables.changelog_topics
        tps = [tp for tp in sorted(self._assigned) if tp.topic not in changelogs]
        written = await self._owned_written()
        tps += written
        self._horizons.forget(tps)
        if not tps:
            return 0
        topics = sorted({tp.topic for tp in tps})
        now_ms = int(time.time() * 1000)
        for topic in sorted({tp.topic for tp in tps if tp not in written}):
            await client.zadd(keys.readers(topic), {self.app.conf.id: now_ms})
        readers = {
            t: [g.decode() for g in await client.zrangebyscore(keys.readers(t), now_ms - READER_TTL_S * 1000, "+inf")]
            for t in topics
        }
        highwaters = await self.highwaters(*tps)
        every = sorted({g for gs in readers.values() for g in gs})
        pairs = [(tp.topic, tp.partition) for tp in tps]
        by_group = {g: dict(zip(tps, await read_committed(client, keys, g, pairs))) for g in every}
        mono, trimmed = time.monotonic(), 0
        for tp in tps:
            self._horizons.observe(tp, mono, highwaters[tp])
            groups = [g for g in readers[tp.topic] if tp not in written or g != self.app.conf.id]
            committed = [by_group[g][tp] for g in groups]
            aged = self._horizons.aged(tp, mono)
            horizon = trim_horizon(committed, aged) if committed else (aged if tp in written else 0)
            # never at or past the stream's end as it is now: after a rollback (AOF, a
            # failover: .integrity) a committed offset or an aged sample can be above it,
            # and the entries appended since would be deleted unread
            horizon = min(horizon, highwaters[tp])
            trimmed += await trim_partition(client, keys, tp.topic, tp.partition, horizon)
        return trimmed

    async def _owned_written(self) -> list:
        """The partitions of the hooks' ``trim_written`` topics this worker trims: those
        numbered as the partitions it reads (co-partitioned by user id)."""
        changelogs = self.app.tables.changelog_topics
        numbers = {tp.partition for tp in self._assigned if tp.topic not in changelogs}
        out = []
        for topic in sorted(hooks_of(self.app).trim_written):
            n = await self.transport.partitions(topic)
            out += [TP(topic, p) for p in sorted(numbers) if p < n and TP(topic, p) not in self._assigned]
        return out

    # -- subscription and rebalance ---------------------------------------

    async def subscribe(self, topics: Any) -> None:
        self._subscription = set(topics)
        self._rebalance_wanted.set()

    async def _rebalance(self) -> None:
        async with self._rebalance_lock:
            transport = self.transport
            parts = {t: await transport.partitions(t) for t in self._subscription}
            owned = set(self.leases.owned)
            new = {
                TP(t, p) for t, n in parts.items() for p in range(n) if self.leases.slot_of(p) in owned
            }
            if new == self._assigned and self._generation:
                return
            await self._fence_changelogs(new)
            # the commits' fence too, now: the revocation below commits first, and
            # its flush waits for the record store, which a worker stopped in the
            # middle of a write (SIGSTOP, the previous owner of these slots) holds;
            # fenced only after it, the stopped owner's commits landed when it woke
            # (the sigstop fault drill, once in two runs of the whole suite).
            # _reset_positions writes the same copy again (idempotent)
            await self._fence_commits(new)
            self.app.on_rebalance_start()
            await self.on_partitions_revoked(set(self._assigned))
            self._assigned = new
            self._index_streams(new)
            self._generation += 1
            self.app.consumer_generation_id = self._generation
            self._set_assignor(new)
            self._epoch += 1
            await self._reset_positions(new)
            log.info(
                "generation %d: slots %s of %d, %d partitions",
                self._generation, sorted(owned), self.leases.slots, len(new),
            )
            await self.on_partitions_assigned(set(new), generation_id=self._generation)

    def _index_streams(self, tps: Set[TP]) -> None:
        """The stream key of each assigned partition, both ways (a read names
        every assigned partition's stream: not formatted again per read)."""
        keys = self.transport.keys
        self._tp_key = {tp: keys.stream(tp.topic, tp.partition) for tp in tps}
        self._key_tp = {key.encode(): tp for tp, key in self._tp_key.items()}

    async def _fence_changelogs(self, tps: Set[TP]) -> None:
        changelogs = self.app.tables.changelog_topics
        for tp in sorted(tps):
            if tp.topic in changelogs:
                token = self.transport.fence_token(tp.topic, tp.partition)  # slot or member token
                if token:
                    ok = await self._fence_script(
                        keys=[self.transport.keys.fence(tp.topic, tp.partition)],
                        args=[token, SlotLeases.generation(token)],
                    )
                    if not int(ok):
                        self.on_fenced(tp.partition)

    def _set_assignor(self, tps: Set[TP]) -> None:
        actives: dict[str, list[int]] = {}
        for tp in sorted(tps):
            actives.setdefault(tp.topic, []).append(tp.partition)
        assignor: Any = self.app.assignor
        assignor._assignment = ClientAssignment(actives=actives, standbys={})
        assignor._active_tps = set(tps)
        assignor._standby_tps = set()

    async def _reset_positions(self, tps: Set[TP]) -> None:
        self._pos = {}
        await self._fence_commits(tps)
        await self.seek_to_committed()

    async def _fence_commits(self, tps: Set[TP]) -> None:
        """Copy this worker's fence tokens next to the commits of the partitions it
        takes, before it reads their committed offsets: from then on no older token
        commits them (docs/adr/0004-group-state-by-partition.md)."""
        keys, group = self.transport.keys, self.app.conf.id
        done: set = set()
        for tp in sorted(tps):
            fence = self._commit_fence(tp)
            if fence is None or (tp.partition, fence) in done:
                continue
            done.add((tp.partition, fence))
            ok = await self._commit_fence_script(
                keys=[keys.commit_fence(group, tp.partition)],
                args=[fence[0], fence[1], SlotLeases.generation(fence[1])],
            )
            if not int(ok):
                self.on_fenced(fence[0] if isinstance(fence[0], str) else tp.partition)

    # -- positions ---------------------------------------------------------

    async def seek_to_committed(self) -> Mapping[TP, int]:
        tps = sorted(self._assigned)
        if not tps:
            return {}
        # the batch being delivered is stale from now on, not only once the offsets
        # are read: what the drain delivered while this awaited was delivered again
        # from the committed offsets (a bad entry dead-lettered twice at start-up)
        self._epoch += 1
        # read again from the committed offsets, and Faust's count set back to them
        # (perform_seek): a target a hold kept a commit below is no longer one, or
        # the next commit would pass entries read again and not yet handled
        self._behind.clear()
        self._stuck.clear()
        keys = self.transport.keys
        client = await self.transport.client()
        fields = [keys.tp_field(tp.topic, tp.partition) for tp in tps]
        own = await read_committed(client, keys, self.app.conf.id, [(tp.topic, tp.partition) for tp in tps])
        theirs = await self._peer_offsets(client, tps, fields)
        committed = await self._handed_over(client, tps, fields, own, theirs)
        missing = [tp for tp, c in zip(tps, committed) if c is None]
        if self.app.conf.consumer_auto_offset_reset == "latest":
            start = await self.highwaters(*missing)
        else:
            start = await self.earliest_offsets(*missing)
        result: dict[TP, int] = {}
        for tp, c in zip(tps, committed):
            if c is None:
                self._pos[tp] = start[tp]
            else:
                self._pos[tp] = result[tp] = c
            # what was delivered past the new position is delivered again
            self._read_offset[tp] = self._pos[tp] or None
        self._epoch += 1
        return result

    async def _peer_offsets(self, client: Any, tps: list, fields: list) -> list:
        """Per partition, ``[(group, committed), ...]`` of the groups that take turns
        with this one on the topic (``offset_peers``: topic → group ids) and have
        committed on it. Two groups that read the same topic one after the other (a
        deployment switched between roles, pipeline/roles.py) thereby start where
        the other stopped (:meth:`_handed_over`), instead of from the earliest retained
        entry (or from their own position of before the switch) and handling it all
        again."""
        peers: Mapping[str, Any] = hooks_of(self.app).offset_peers
        groups = sorted({g for tp in tps for g in peers.get(tp.topic, ())})
        if not groups:
            return [[] for _ in tps]
        keys = self.transport.keys
        pairs = [(tp.topic, tp.partition) for tp in tps]
        theirs = {g: await read_committed(client, keys, g, pairs) for g in groups}
        return [
            [(g, int(theirs[g][i])) for g in peers.get(tp.topic, ()) if theirs[g][i] is not None]
            for i, tp in enumerate(tps)
        ]

    async def _handed_over(self, client: Any, tps: list, fields: list, own: list, theirs: list) -> list:
        """Where each partition is read from: the group's committed offset raised to
        the furthest of its peers' (:meth:`_peer_offsets`), after the integrity check
        of :mod:`.integrity`: an offset past the partition's end (the stream rolled
        back: AOF everysec, a failover) is never followed. The group's own is
        reported (ERROR, ``on_offset_rollback``) and repaired: read again from the
        first entry the stream holds, and rewritten to that in Redis (fenced, compare
        and set). A peer's is only ignored (that group repairs it when it seeks).
        None: no committed offset (``auto_offset_reset`` decides)."""
        probe = [tp for i, tp in enumerate(tps) if own[i] is not None or theirs[i]]
        if not probe:
            return list(own)
        ends = await self._stream_ends(client, probe)
        out: list = []
        for i, tp in enumerate(tps):
            if tp not in ends:
                out.append(None)
                continue
            end, first = ends[tp]
            verdict = check(own[i], end, first)
            valid = [v for v in (own[i], *(c for _g, c in theirs[i])) if v is not None and v <= end]
            for g, c in theirs[i]:
                if c > end:
                    log.warning(
                        "%s[%d]: group %s committed %d, past the stream's end %d (the stream lost writes): "
                        "not followed", tp.topic, tp.partition, g, c, end,
                    )
            if verdict.rolled_back:
                out.append(await self._repair_rollback(client, tp, fields[i], verdict))
            elif valid:
                out.append(max(valid))
            elif theirs[i]:  # only peers' offsets, all past the end: never skip what follows
                out.append(check(max(c for _g, c in theirs[i]), end, first).start)
            else:
                out.append(None)
        return out

    async def _stream_ends(self, client: Any, tps: list) -> dict:
        """tp → (end: the next offset it assigns, offset of its first entry or None),
        one round trip."""
        keys = self.transport.keys
        pipe = client.pipeline(transaction=False)
        for tp in tps:
            stream = keys.stream(tp.topic, tp.partition)
            pipe.get(keys.counter(tp.topic, tp.partition))
            pipe.xrevrange(stream, count=1)
            pipe.xrange(stream, count=1)
        res = await pipe.execute()
        out = {}
        for i, tp in enumerate(tps):
            counter, last, first = res[3 * i: 3 * i + 3]
            end = stream_end(
                int(counter) if counter is not None else None, offset_of(last[0][0]) if last else None,
            )
            out[tp] = (end, offset_of(first[0][0]) if first else None)
        return out

    async def _repair_rollback(self, client: Any, tp: TP, field: str, verdict: Verdict) -> int:
        """The group's committed offset of ``tp`` is past the stream's end: report it
        and return the offset to read from, rewritten as the committed one."""
        log.error(
            "%s[%d]: committed offset %d is past the stream's end %d: the stream lost writes "
            "(AOF everysec, a failover); reading again from %d, the first entry it holds "
            "(what was handled already is absorbed by the effect ledger)",
            tp.topic, tp.partition, verdict.committed, verdict.end, verdict.start,
        )
        report = hooks_of(self.app).on_offset_rollback
        if report is not None:
            try:
                report(tp.topic, tp.partition, verdict.committed, verdict.end)
            except Exception:  # a broken metric must not stop the seek
                log.exception("on_offset_rollback failed")
        self._hw[tp] = verdict.end
        start: int = verdict.start  # type: ignore[assignment]
        fence = self._commit_fence(tp)
        if fence is None:  # a standby: the owner repairs it
            log.warning("%s[%d]: not rewriting the committed offset: not the owner", tp.topic, tp.partition)
            return start
        if self._rewrite_script is None:
            self._rewrite_script = client.register_script(REWRITE_COMMITTED)
        group = self.app.conf.id
        keys = self.transport.keys
        try:
            start = await rewrite_committed(
                self._rewrite_script, keys.commits(group, tp.partition), keys.commit_fence(group, tp.partition),
                field, verdict, fence,
            )
            # the layout before ADR 0004 (read too, the larger wins) must not bring it back
            await client.hdel(keys.offsets(group), field)
            return start
        except ResponseError as exc:
            if not str(exc).startswith("FENCED"):
                raise
            log.warning("%s[%d]: committed offset not rewritten: fenced (another worker owns it)",
                        tp.topic, tp.partition)
            self._on_commit_fenced(str(exc).split()[1])
            return start

    async def _seek(self, partition: TP, offset: int) -> None:
        self._pos[partition] = max(0, offset)
        self._epoch += 1

    async def seek_wait(self, partitions: Mapping[TP, int]) -> None:
        for tp, offset in partitions.items():
            await self._seek(tp, offset)
            if offset > 0:
                self._read_offset[tp] = offset
            else:
                self._read_offset.pop(tp, None)

    async def position(self, tp: TP) -> Optional[int]:
        return self._pos.get(tp)

    def assignment(self) -> Set[TP]:
        return set(self._assigned)

    def ack(self, message: Any) -> bool:
        """Faust's, except for a message no agent was handed: a stream drops what it
        takes from its queue while the flow is suspended (a rebalance has begun) or
        that was read in an earlier generation, and acknowledges it so that lag does
        not grow. Counted as done, it let the revoke's commit pass an event nobody
        handled: the partition's next reader (this worker or another) started after
        it and the event was never planned (the elastic fault drill lost an OTP
        written during a join that way). Such a message is let go here without
        counting it, so the committed offset stays below it and it is read again.
        A message an agent took (``tracked``: set by the stream before any
        processor, filters included) is counted as Faust counts it, and so is one
        acknowledged under a flowing current generation without reaching a stream:
        an entry that did not decode, dead-lettered by its topic (Faust's conductor
        acknowledges it there; tests/security/test_poison.py)."""
        if not message.tracked and not message.acked and self._dropped_by_a_stream(message):
            message.acked = True
            self._unacked_messages.discard(message)
            return False
        return super().ack(message)

    def _dropped_by_a_stream(self, message: Any) -> bool:
        """What Faust's stream checks before it drops a message unhandled."""
        app = self.app
        return not app.flow_control.is_active() or message.generation_id != app.consumer_generation_id

    def _new_offset(self, tp: TP) -> Optional[int]:
        """Faust's, except that nothing is committable while the committed offset's
        own entry (the next to read) is neither acknowledged nor a gap. Faust lets
        a commit pass exactly one unacknowledged entry there (``min(acked) -
        committed > 1``: slack for a Kafka offset with no message), so an entry
        dropped unhandled right at the committed offset while later ones were
        handled was passed for ever: the elastic drill lost an OTP so (committed
        36, then 85 in one commit, the event at 36 never planned). Our offsets
        have no holes: the entry at the committed offset is always read, so
        waiting for it costs nothing but the wait."""
        committed = self._committed_offset[tp]
        if (committed is not None and self._acked[tp] and committed not in self._acked_index[tp]
                and not self._gap[tp].overlaps(committed)):
            self._stuck_at(tp, committed)
            return None
        self._stuck.pop(tp, None)
        return super()._new_offset(tp)

    def _stuck_at(self, tp: TP, committed: int) -> None:
        """The commit of ``tp`` waits for the entry at ``committed`` (later ones are
        done). Normally that entry is still being handled. One that was read and
        that no stream holds was dropped on its way (a cause not known, or a bug of
        the kind drain.py describes): it would stop the partition's commits until
        the next rebalance or restart, the lag and the replay after a crash growing
        meanwhile. After :data:`REREAD_AFTER_S` of that, say so and read every
        partition again from its committed offset, as the end of a rebalance does:
        what was done is handled again as a replay, the dropped entry at last."""
        now = time.monotonic()
        since = self._stuck.get(tp)
        if since is None or since[0] != committed:
            self._stuck[tp] = (committed, now)
            return
        if now - since[1] < REREAD_AFTER_S or self._reread is not None:
            return
        if (self._read_offset.get(tp) or 0) <= committed:
            return  # not read yet (a backlog, a paused partition)
        if any(m.tp == tp and m.offset == committed for m in self._unacked_messages):
            return  # a stream has it: still being handled
        log.warning("%s: the entry at offset %d was read %.0f s ago and never handled, while later ones were; "
                    "reading the partitions again from their committed offsets", tp, committed, now - since[1])
        self._stuck.clear()
        self._reread = asyncio.ensure_future(self._read_again())

    async def _read_again(self) -> None:
        try:
            async with self._rebalance_lock:
                await self.perform_seek()
        except Exception:  # noqa: BLE001 - the next commits find the partition stuck again
            log.exception("reading the partitions again failed")
        finally:
            self._reread = None

    def owns(self, topic: str, partition: int) -> bool:
        """Whether ``topic[partition]`` is assigned to this worker now (no copy of
        the assignment, as :meth:`assignment` makes)."""
        return TP(topic, partition) in self._assigned

    def highwater(self, tp: TP) -> int:
        return self._hw.get(tp, 0)

    def topic_partitions(self, topic: str) -> Optional[int]:
        return self.transport.partitions_cached(topic)

    def key_partition(self, topic: str, key: Optional[bytes], partition: Optional[int] = None) -> Optional[int]:
        if partition is not None:
            return partition
        return self.transport.partition_for(topic, key)

    async def earliest_offsets(self, *partitions: TP) -> Mapping[TP, int]:
        if not partitions:
            return {}
        keys = self.transport.keys
        client = await self.transport.client()
        pipe = client.pipeline(transaction=False)
        for tp in partitions:
            pipe.xrange(keys.stream(tp.topic, tp.partition), count=1)
            pipe.get(keys.counter(tp.topic, tp.partition))
        res = await pipe.execute()
        out = {}
        for i, tp in enumerate(partitions):
            first, hw = res[2 * i], int(res[2 * i + 1] or 0)
            out[tp] = offset_of(first[0][0]) if first else hw
        return out

    async def highwaters(self, *partitions: TP) -> Mapping[TP, int]:
        if not partitions:
            return {}
        keys = self.transport.keys
        client = await self.transport.client()
        counters = [keys.counter(tp.topic, tp.partition) for tp in partitions]
        if self.transport.is_cluster:
            values = await client.mget_nonatomic(counters)  # one MGET per slot, in order
        else:
            values = await client.mget(counters)
        out = {tp: int(v or 0) for tp, v in zip(partitions, values)}
        self._hw.update(out)
        return out

    async def create_topic(self, topic: str, partitions: int, replication: int, **kwargs: Any) -> None:
        await self.transport.declare(
            topic, partitions, retention=kwargs.get("retention"), compacting=kwargs.get("compacting")
        )

    def _new_topicpartition(self, topic: str, partition: int) -> TP:
        return TP(topic, partition)

    # -- fetching ----------------------------------------------------------

    async def _getmany(self, active_partitions: Optional[Set[TP]], timeout: float) -> Mapping[TP, list]:
        """Faust's fetch: every assigned partition except the priority topics', which
        the priority drain reads (:meth:`FastDrain._drain_priority`)."""
        assigned = self._assigned
        prio = self._priority_topics
        tps = [
            tp for tp in (assigned if active_partitions is None else active_partitions)
            if tp in assigned and tp.topic not in prio
        ]
        return await self._fetch(tps, timeout, MAIN)

    async def _fetch(self, tps: list, timeout: float, lane: str) -> Mapping[TP, list]:
        """One read of ``tps`` for ``lane`` (MAIN or PRIORITY: each lane has its own
        read, batch stamp and, on a cluster, its own outstanding reads)."""
        if not tps:  # every partition of this lane paused (or none assigned)
            await self._wait_resumed(min(timeout, 0.2))
            return {}
        keys = self.transport.keys
        pos = self._pos
        tp_key = self._tp_key
        # keys.after_id, inline: a round reads every partition of the lane
        streams = {tp_key.get(tp) or keys.stream(tp.topic, tp.partition):
                   b"%d-1" % (p - 1) if (p := pos.get(tp, 0)) > 0 else b"0-0" for tp in tps}
        epoch, generation = self._epoch, self._generation
        # A partition paused on a full stream buffer may resume any moment, and a
        # blocked XREAD would not see it until its timeout (which the server only
        # checks every 100 ms): while one of this lane's is paused, poll the others
        # and wait for the resume on this side.
        prio = self._priority_topics
        paused = any((tp.topic in prio) == (lane == PRIORITY) for tp in self._buffered_partitions)
        try:
            client = await self.transport.reader()
            if self.transport.is_cluster:
                resp = await self._xread_cluster(client, streams, min(timeout, 0.02) if paused else timeout, lane)
            else:
                block = () if paused else ("BLOCK", max(1, int(timeout * 1000)))
                resp = await client.execute_command(
                    "XREAD", "COUNT", self._max_records, *block, "STREAMS", *streams, *streams.values(),
                )
                if paused and not resp:
                    await self._wait_resumed(PAUSED_POLL_S)
        except TRANSIENT_ERRORS as exc:
            log.warning("read failed (%s); reconnecting", exc)
            await asyncio.sleep(0.5)
            return {}
        if epoch != self._epoch or generation != self._generation or not resp:
            return {}  # a seek or rebalance happened meanwhile: this batch is stale
        out: dict[TP, list] = {}
        key_tp = self._key_tp
        hw = self._hw
        for key, entries in resp.items() if isinstance(resp, dict) else resp:
            tp = key_tp.get(key)
            if tp is None or not entries:
                continue
            recs = [_decode(eid, fields) for eid, fields in entries]
            out[tp] = recs
            nxt = recs[-1].offset + 1
            pos[tp] = nxt
            if hw.get(tp, 0) < nxt:
                hw[tp] = nxt
        self._batch_stamps[lane] = (epoch, generation)
        return out

    def unread(self, tp: TP, offset: int, lane: str) -> None:
        """Read ``tp`` again from ``offset``: the rest of a batch that will not be
        delivered (its position was moved past it when it was fetched). Nothing to
        do once the batch is stale: the seek or rebalance set the positions."""
        if self.batch_is_current(lane) and self._pos.get(tp, 0) > offset:
            self._pos[tp] = offset

    def batch_generation_is_current(self, lane: str = MAIN) -> bool:
        """False once a rebalance happened after the lane's last batch was fetched:
        what it delivered carries the old generation, and the streams drop it."""
        stamp = self._batch_stamps.get(lane)
        return stamp is not None and stamp[1] == self._generation

    def batch_is_current(self, lane: str = MAIN) -> bool:
        """False once a seek or rebalance happened after the lane's last batch was
        fetched: the rest of it must not be delivered (it is read again from the new
        position)."""
        return self._batch_stamps.get(lane) == (self._epoch, self._generation)

    def _slot_groups(self, client: Any, streams: Mapping[str, bytes]) -> dict[int, list[str]]:
        slots: dict[int, list[str]] = {}
        key_slot = self._key_slot
        for key in streams:
            slot = key_slot.get(key)
            if slot is None:
                slot = key_slot[key] = client.keyslot(key)
            slots.setdefault(slot, []).append(key)
        return slots

    async def _xread_cluster(self, client: Any, streams: Mapping[str, bytes], timeout: float, lane: str) -> list:
        """XREAD on Redis Cluster: one blocking XREAD per hash slot, kept across calls.

        A multi-key XREAD must stay in one slot and every partition has its own
        hash tag, so each slot gets its own ``XREAD BLOCK``, sent straight to the
        slot's node (``target_nodes``: otherwise redis-py asks the server for the
        keys of every XREAD with COMMAND GETKEYS, two extra round trips).  The
        reads run as tasks; this returns as soon as any has data, with every read
        that finished by then.  The others are NOT cancelled (a cancelled blocked
        read makes redis-py drop its connection): they stay outstanding and are
        reused by the next call as long as they still ask for the same streams
        from the same positions in the same epoch/generation; otherwise they are
        replaced and their result, whenever it comes, is dropped.  So a message
        on any slot wakes the consumer at once, and an idle worker costs one
        read per slot per ``timeout``; the price is one connection per slot
        with a read outstanding.

        (Short non-blocking passes with a short block in between are not
        enough: the server checks BLOCK timeouts only every 1000/hz ms, i.e.
        100 ms by default, so an idle worker would add ~100 ms of latency.)
        """
        count = self._max_records
        block = max(1, int(timeout * 1000))
        stamp = (self._epoch, self._generation)
        reads = self._reads.setdefault(lane, {})
        groups = self._slot_groups(client, streams)
        for slot, keys in groups.items():
            want = frozenset([(k, streams[k]) for k in keys])
            r = reads.get(slot)
            if r is None or r.want != want or r.stamp != stamp:
                if r is not None:
                    self._drop_read(r)
                args = ["XREAD", "COUNT", count, "BLOCK", block, "STREAMS", *keys, *(streams[k] for k in keys)]
                task = asyncio.ensure_future(
                    client.execute_command(*args, target_nodes=client.get_node_from_key(keys[0]))
                )
                task.add_done_callback(_retrieve)
                reads[slot] = _Read(task, want, stamp)
        for slot in [s for s in reads if s not in groups]:
            self._drop_read(reads.pop(slot))
        done, _pending = await asyncio.wait(
            [r.task for r in reads.values()], timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if not done:
            return []
        await asyncio.sleep(0)  # also take the reads whose replies arrived together
        resp: list = []
        error: Optional[BaseException] = None
        for slot, r in list(reads.items()):
            if not r.task.done():
                continue
            del reads[slot]
            if r.task.cancelled():
                continue
            exc = r.task.exception()
            if exc is not None:
                error = error or exc
            elif r.task.result():
                got = r.task.result()  # RESP3: a map, RESP2: a list of pairs
                resp += got.items() if isinstance(got, dict) else got
        if error is not None and not resp:
            raise error
        return resp

    def _drop_read(self, r: _Read) -> None:
        """Forget a read: it finishes on its own (its result is dropped)."""
        if not r.task.done():
            self._replaced.add(r.task)
            r.task.add_done_callback(self._replaced.discard)

    def _cancel_reads(self) -> None:
        for task in [r.task for reads in self._reads.values() for r in reads.values()] + list(self._replaced):
            task.cancel()
        self._reads.clear()
        self._replaced.clear()

    def _to_message(self, tp: TP, record: Record) -> ConsumerMessage:
        key, value = record.key, record.value
        return ConsumerMessage(
            tp.topic,
            tp.partition,
            record.offset,
            record.timestamp,
            0,
            record.headers,
            key,
            value,
            None,
            len(key) if key else 0,
            len(value) if value else 0,
            tp,
            generation_id=self._generation,
        )

    # -- commits -----------------------------------------------------------

    def _filter_committable_offsets(self, tps: Any) -> dict:
        """Faust's committable offsets, and the holds (holds.py) read now, before the
        sinks and the producer flush: a hold released during that flush (a delivery
        handed to a lane in memory, done meanwhile: its records were added after the
        flush began) must not let this commit pass the event it came from, whose
        offset Faust took as acknowledged long before. Faust keeps counting the
        offsets it returns as committed; a partition a hold kept behind them
        (:attr:`_behind`) is committed again at the next commits, acknowledged
        entries or not, until it reaches them."""
        offsets = dict(super()._filter_committable_offsets(tps))
        for tp, target in self._behind.items():
            offsets.setdefault(tp, target)
        holds = self.holds
        self._caps = {tp: holds.cap(tp, offset) for tp, offset in offsets.items()}
        return offsets

    async def _commit(self, offsets: Mapping[TP, int]) -> bool:
        """Commit ``offsets``: one COMMIT_PART per partition index (its offsets and
        fence copy share a hash slot: docs/adr/0004-group-state-by-partition.md), all
        sent at once; on a cluster each goes to its own master. True when every one
        was written."""
        keys = self.transport.keys
        group = self.app.conf.id
        by_p: dict[int, list[Any]] = {}
        holds = self.holds
        caps, behind = self._caps, self._behind
        for tp, target in offsets.items():
            if tp not in self._assigned:
                behind.pop(tp, None)
                continue
            # never past an entry whose work is in flight, now or when the offsets were taken
            offset = min(holds.cap(tp, target), caps.get(tp, target))
            if offset < target:
                behind[tp] = target
            else:
                behind.pop(tp, None)
            fence = self._commit_fence(tp)
            if fence is None:
                log.warning("not committing %s: slot no longer owned", tp)
                return False
            by_p.setdefault(tp.partition, []).extend(
                [keys.tp_field(tp.topic, tp.partition), offset, fence[0], fence[1], SlotLeases.generation(fence[1])])
        if not by_p:
            return False
        done = await asyncio.gather(*(self._commit_part(group, p, args) for p, args in sorted(by_p.items())))
        return all(done)

    async def _commit_part(self, group: str, partition: int, args: list) -> bool:
        keys = self.transport.keys
        ks = [keys.commits(group, partition), keys.commit_fence(group, partition)]
        delay = 0.05
        for _ in range(6):
            try:
                await self._commit_script(keys=ks, args=[len(args) // 5] + args)
                return True
            except ResponseError as exc:
                if str(exc).startswith("FENCED"):
                    field = str(exc).split()[1]
                    log.warning("commit refused: slot %s is fenced (another worker owns it)", field)
                    self._on_commit_fenced(field)
                    return False
                if not isinstance(exc, TRANSIENT_ERRORS):  # CLUSTERDOWN, TRYAGAIN: retry
                    raise
                log.warning("commit failed (%s); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
            except TRANSIENT_ERRORS as exc:
                log.warning("commit failed (%s); retrying in %.2fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        return False

    def _commit_fence(self, tp: TP) -> Optional[tuple[Any, str]]:
        """(group fence field, token) a commit of ``tp`` is checked against, or None."""
        token = self.leases.token_for(tp.partition)
        return None if token is None else (self.leases.slot_of(tp.partition), token)

    def _on_commit_fenced(self, field: str) -> None:
        self.on_fenced(int(field))

    def close(self) -> None:
        pass

    def verify_event_path(self, now: float, tp: TP) -> None:
        return None
