"""Elastic consumer: dynamic group membership (``?members=dynamic``).

The member side of the eager protocol of :mod:`.membership`, wired into
Faust's rebalance callbacks.  On every new group generation the member revokes
all its partitions (Faust commits them under the old token), acknowledges the
generation and waits for the generation's assignment; the leader (lowest
member id) computes it with the app's own PartitionAssignor, so table
partitions and their standby replicas (``table_standby_replicas``) are placed
as Faust intends, and writes it once.  The member then fences its changelog
partitions with ``<member>:<gen>`` and hands actives and standbys to Faust
(``on_partitions_assigned``): standby changelog partitions are read by Faust's
recovery, which keeps a warm copy of the tables (see tables/store.py).
"""

import asyncio
import json
import logging
import time
from typing import Any, Optional, Set

from aiokafka.coordinator.protocol import ConsumerProtocolMemberMetadata
from faust.assignor.client_assignment import ClientAssignment, ClientMetadata
from faust.types import TP
from mode import Service

from .consumer import Consumer
from .membership import GroupState, Membership
from .hooks import hooks_of

__all__ = ["ElasticConsumer"]

log = logging.getLogger(__name__)

#: how often a member polls the group state while a rebalance is in progress
SYNC_POLL_S = 0.05
#: how often a member checks the generation between heartbeats (one HGET): a
#: join or leave is noticed this fast instead of at the next heartbeat
GENERATION_POLL_S = 0.1


class _Cluster:
    """The piece of aiokafka's ClusterMetadata that the PartitionAssignor uses."""

    def __init__(self, partitions: dict[str, int]) -> None:
        self._partitions = partitions

    def partitions_for_topic(self, topic: str) -> Optional[Set[int]]:
        n = self._partitions.get(topic)
        return set(range(n)) if n else None




class ElasticConsumer(Consumer):
    def __init__(self, transport: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(transport, *args, **kwargs)
        opts = transport.options
        self.membership = Membership(
            transport.keys, self.app.conf.id, lease_s=opts.lease_s, sync_s=opts.sync_s
        )
        self.leases = self.membership  # the base heartbeat runs every lease/3
        transport.leases = None
        transport.membership = self.membership
        self._revoking_started: Optional[float] = None
        #: set on every assignment change: wakes a fetch blocked on the old streams
        self._wake = asyncio.Event()
        #: between an assignment and its first records: Faust's recovery resumes
        #: the partitions while a fetch may block on the changelogs it just read
        self._settling = False
        #: (duration s, generation) of each rebalance this member completed
        self.rebalances: list[tuple[float, int]] = []

    # -- lifecycle ---------------------------------------------------------

    async def on_start(self) -> None:
        self._register_scripts(await self.transport.client())

    async def on_stop(self) -> None:
        self._cancel_reads()
        await super(Consumer, self).on_stop()  # Faust's: final commit
        try:
            await self.membership.leave(await self.transport.client())
        except Exception as exc:  # pragma: no cover - best effort
            log.warning("could not leave the group: %s", exc)

    async def _tick_leases(self) -> None:
        """Heartbeat: renew the member lease; notice expulsion and new generations."""
        m = self.membership
        if not m.joined:
            return
        status, gen, agen = await m.heartbeat(await self.transport.client())
        if status < 0:
            self._on_expelled()
        if status < 0 or gen != m.applied_gen or agen != gen:
            self._rebalance_wanted.set()

    @Service.task
    async def _generation_watch(self) -> None:
        m = self.membership
        state_key = self.transport.keys.member_keys(m.group)[3]
        while not self.should_stop:
            await self.sleep(GENERATION_POLL_S)
            if not m.joined or not m.applied_gen or self._rebalance_wanted.is_set():
                continue
            try:
                gen = await (await self.transport.client()).hget(state_key, "gen")
            except Exception as exc:  # the heartbeat reports broker trouble
                log.debug("generation poll failed: %s", exc)
                continue
            if int(gen or 0) != m.applied_gen:
                self._rebalance_wanted.set()

    async def _fetch(self, tps: Any, timeout: float, lane: str) -> Any:
        """The base fetch, abandoned when the assignment changes: an XREAD BLOCK
        on the old streams would otherwise hold the new partitions up to ``timeout``."""
        wake = self._wake
        wake.clear()
        read = asyncio.ensure_future(super()._fetch(tps, timeout, lane))
        waiter = asyncio.ensure_future(wake.wait())
        try:
            done, _ = await asyncio.wait({read, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            read.cancel()
            raise
        finally:
            waiter.cancel()
        if read in done:
            res = read.result()
            if res:
                self._settling = False
            return res
        read.cancel()  # redis-py drops that connection: one reconnect per rebalance
        try:
            await read
        except BaseException:
            pass
        return {}

    async def _wait_next_records(self, timeout: float) -> Any:
        # Faust's recovery resumes the flow a moment before the partitions: a
        # fetch woken by the flow then finds every partition paused and Faust's
        # fetch sleeps a whole second; waiting for the flow first lets the
        # drain's own wait-for-resume (FastDrain) take that case instead.
        if not self.flow_active:
            await self.wait(self.can_resume_flow)
        return await super()._wait_next_records(timeout)

    def resume_partitions(self, tps: Any) -> None:
        super().resume_partitions(tps)
        if self._settling:
            self._wake.set()

    def _on_expelled(self) -> None:
        m = self.membership
        if m.joined:
            log.warning("member %s was expelled from group %s", m.member_id, m.group)
            report = hooks_of(self.app).on_expelled
            if report is not None:
                report()
        m.drop_all()
        m.joined = False

    def on_fenced(self, partition: Any) -> None:
        """A write or commit was refused: the group moved on (or expelled us).

        Nothing is dropped here: the refusal may come from a write made with an
        older generation's token that was still in flight when this member
        applied a newer assignment (a zombie that woke up and rejoined).  Redis
        refuses every write of a stale token anyway; the rebalance loop finds out
        whether this member was expelled (then it forgets its tables) or only
        has to move to the new generation."""
        log.warning("fenced on %s: checking the group (member %s)", partition, self.membership.member_id)
        self._rebalance_wanted.set()

    def _on_commit_fenced(self, field: str) -> None:
        self.on_fenced(field)

    def _commit_fence(self, tp: TP) -> Optional[tuple[Any, str]]:
        token = self.membership.token_for(tp)
        return None if token is None else (Membership.fence_field(tp), token)

    # -- the eager protocol ------------------------------------------------

    async def _rebalance(self) -> None:
        async with self._rebalance_lock:
            if not self._subscription:
                return
            client = await self.transport.client()
            m = self.membership
            url = str(self.app.conf.canonical_url)
            info = json.dumps({"topics": sorted(self._subscription), "url": url}, sort_keys=True)
            if m.joined and info != m.info_json:
                await m.join(client, self._subscription, url)  # subscription changed: bumps the generation
            while not self.should_stop:
                if not m.joined:
                    if self._assigned or m.applied_gen:
                        await self._revoke_all()
                        self._forget_tables()  # may hold writes the changelog refused
                    m.applied_gen = m.revoked_gen = 0
                    await m.join(client, self._subscription, url)
                    continue
                st = await m.read(client)
                if m.member_id not in st.live:
                    self._on_expelled()
                    continue
                gen = st.gen
                if m.applied_gen == gen and st.assign_gen == gen:
                    return
                if self._revoking_started is None:
                    self._revoking_started = time.monotonic()
                if m.revoked_gen != gen:
                    await self._revoke_all()
                    if await m.ack(client, gen) < 0:
                        self._on_expelled()
                    continue
                if st.assign_gen == gen:
                    raw = st.assignments.get(m.member_id)
                    if raw is None:  # written for a member set without us: wait for the next generation
                        await asyncio.sleep(SYNC_POLL_S)
                        continue
                    await self._apply(ClientAssignment.loads(raw.encode()), gen)
                    took = time.monotonic() - self._revoking_started
                    self._revoking_started = None
                    self.rebalances.append((took, gen))
                    report = hooks_of(self.app).on_rebalance
                    if report is not None:
                        report(took, gen)
                    log.info(
                        "generation %d applied in %.3fs: %d members, %d active, %d standby partitions",
                        gen, took, len(st.live), len(m.active), len(self._assigned) - len(m.active),
                    )
                    return
                if st.all_acked() and st.members[0] == m.member_id:
                    assignments, fences = await self._compute_assignment(st)
                    ok = await m.write_assignment(client, gen, assignments, fences)
                    if ok:
                        log.info("leader %s wrote the assignment of generation %d", m.member_id, gen)
                        continue
                await asyncio.sleep(SYNC_POLL_S)

    async def _revoke_all(self) -> None:
        """Eager: give every partition up; Faust commits under the old token."""
        m = self.membership
        if self._assigned:
            self.app.on_rebalance_start()
            await self.on_partitions_revoked(set(self._assigned))
        m.drop_all()
        self._assigned = set()
        self._index_streams(set())
        self._generation += 1
        self._epoch += 1
        m.revoked_gen = 0
        self._wake.set()

    def _forget_tables(self) -> None:
        for table in self.app.tables.values():
            forget = getattr(table.data, "forget", None)
            if forget is not None:
                forget()

    async def _compute_assignment(self, st: GroupState) -> tuple[dict[str, str], dict[str, str]]:
        """The leader's job: Faust's PartitionAssignor over the live members."""
        topics: set[str] = set()
        for mid in st.members:
            topics.update(st.info.get(mid, {}).get("topics", []))
        parts = {t: await self.transport.partitions(t) for t in sorted(topics)}
        assignor: Any = self.app.assignor
        metadata = {}
        for mid in st.members:
            prev = st.assignments.get(mid)  # the previous generation's: the assignor is sticky
            ca = ClientAssignment.loads(prev.encode()) if prev else ClientAssignment(actives={}, standbys={})
            ca = _only_existing(ca, parts)
            meta = ClientMetadata(
                assignment=ca,
                url=st.info.get(mid, {}).get("url") or mid,
                changelog_distribution={},
                external_topic_distribution={},
                topic_groups={},
            )
            metadata[mid] = ConsumerProtocolMemberMetadata(
                assignor.version, sorted(st.info.get(mid, {}).get("topics", [])), meta.dumps()
            )
        result = assignor.assign(_Cluster(parts), metadata)
        assignments: dict[str, str] = {}
        fences: dict[str, str] = {}
        for mid, protocol in result.items():
            ca = ClientMetadata.loads(assignor._decompress(protocol.user_data)).assignment
            assignments[mid] = ca.dumps().decode()
            for tp in ca.active_tps:
                fences[Membership.fence_field(tp)] = f"{mid}:{st.gen}"
        return assignments, fences

    async def _apply(self, ca: ClientAssignment, gen: int) -> None:
        m = self.membership
        token = m.token(gen)
        actives = set(ca.active_tps)
        tps = {TP(t, p) for t, ps in ca.kafka_protocol_assignment(self.app.tables) for p in ps}
        m.active = {tp: token for tp in actives}
        await self._fence_changelogs(actives)
        if not self.app.rebalancing:
            self.app.on_rebalance_start()
        self._assigned = tps
        self._index_streams(tps)
        self._generation += 1
        self.app.consumer_generation_id = self._generation
        assignor: Any = self.app.assignor
        assignor._assignment = ca
        assignor._active_tps = actives
        assignor._standby_tps = set(ca.standby_tps)
        self._epoch += 1
        await self._reset_positions(tps)
        m.applied_gen = gen
        self._settling = True
        self._wake.set()
        await self.on_partitions_assigned(set(tps), generation_id=self._generation)


def _only_existing(ca: ClientAssignment, parts: dict[str, int]) -> ClientAssignment:
    def keep(d: dict) -> dict:
        return {t: [p for p in ps if p < parts[t]] for t, ps in d.items() if t in parts}

    return ClientAssignment(actives=keep(ca.actives), standbys=keep(ca.standbys))

