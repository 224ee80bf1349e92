"""The in-memory table store, with changelog batches applied in order.

Faust's ``memory://`` store applies a recovery batch's sets first and its deletes
after, keeping a re-set key only if its new value is truthy: a key deleted and
then set to ``0``, ``""`` or ``[]`` in the same batch is lost on recovery (found
by the transport's property test of table recovery). This store applies every
entry in changelog order. Registered on the ``faust.stores`` entry point as
``memory-ordered``: ``store="memory-ordered://"``.

It also remembers, per changelog partition, the offset of the last entry it
holds (applied from the changelog or written by this worker), and keeps the
partitions it is a standby for after recovery: a worker that takes over a
partition it kept warm as a standby reads only the changelog tail instead of
the whole changelog.  Keys written by this worker's agents are attributed to
their event's partition too (Faust's memory store knows only the keys it read
from a changelog), so a partition given up is dropped whole after recovery.
:meth:`Store.forget` drops everything (a worker that was fenced may hold writes
the changelog refused).
"""

import logging
import time
from typing import Any, Callable, Iterable, Optional, Set

from faust import current_event
from faust.stores import memory
from faust.types import TP, EventT

from pipeline.transport.groups import DELETED, changes, is_group

__all__ = ["Store"]

log = logging.getLogger(__name__)


class Store(memory.Store):
    #: a group entry (pipeline/transport/groups.py) is applied as the changes it
    #: lists, in order, at its place in the changelog
    applies_groups = True

    def __post_init__(self) -> None:
        super().__post_init__()
        self._offsets: dict[TP, int] = {}
        #: set by forget() until the next recovery completed: a changelog batch
        #: still in flight may land after forget() and must not make its offset
        #: look like a warm copy
        self._cold = False
        #: changelog partitions read in bulk for this assignment: what the store
        #: holds of them is exactly the changelog up to their offset
        self._loaded: set[TP] = set()

    def get(self, key: Any, default: Any = None) -> Any:
        """``Mapping.get`` (through ``__getitem__`` and a ``KeyError`` for a missing
        key: three Python calls) as the dict's own: this store has no ``__missing__``,
        so the answer is the same. Every read of the guard's state and the lanes'
        marks goes through here."""
        return self.data.get(key, default)

    def apply_changelog_batch(
        self,
        batch: Iterable[EventT],
        to_key: Callable[[Any], Any],
        to_value: Callable[[Any], Any],
    ) -> None:
        data, partitions, offsets, loaded = self.data, self._key_partition, self._offsets, self._loaded
        for event in batch:
            message = event.message
            if loaded and getattr(message, "tp", None) in loaded and message.offset <= offsets.get(message.tp, -1):
                continue  # read in bulk already (a batch fetched before the bulk read)
            key = to_key(event.key)
            if message.value is None:
                group = [(key, DELETED)]
            elif is_group(key):
                group = list(changes(event.value, to_key, to_value))  # all or none
            else:
                group = [(key, to_value(event.value))]
            _apply_changes(data, partitions, group, message.partition)
            tp, offset = getattr(message, "tp", None), getattr(message, "offset", None)
            if tp is not None and offset is not None and offsets.get(tp, -1) < offset:
                offsets[tp] = offset

    def __setitem__(self, key: Any, value: Any) -> None:
        # a write by an agent: remember the key's partition (that of the event, as
        # the table's changelog write), so a partition given up is dropped whole
        self.data[key] = value
        event = current_event()
        if event is not None:
            self._key_partition[key] = event.message.partition

    def put_in(self, partition: int, key: Any, value: Any) -> None:
        """Set ``key`` as a key of ``partition``, whatever event is current: expand plans
        a user's intent while it reads an event of another partition, and a lane's
        take has no current event. Attributed to the event's partition (or to none),
        the key was dropped with a partition it is not of, and kept, stale, when its
        own partition was given up."""
        self.data[key] = value
        self._key_partition[key] = partition

    def __delitem__(self, key: Any) -> None:
        del self.data[key]
        self._key_partition.pop(key, None)

    def persisted_offset(self, tp: TP) -> Optional[int]:
        """Offset of the last changelog entry this store holds for ``tp`` (or None).

        Only with dynamic membership (the elastic consumer forgets the state of
        a fenced member); otherwise None, and recovery reads whole changelogs.
        """
        if tp in self._loaded:
            return self._offsets.get(tp)
        if self._cold or not _warm_restarts(self.app):
            return None
        return self._offsets.get(tp)

    def set_persisted_offset(self, tp: TP, offset: int) -> None:
        # called by the table when its own changelog write was acknowledged
        if self._offsets.get(tp, -1) < offset:
            self._offsets[tp] = offset

    async def on_recovery_completed(self, active_tps: Set[TP], standby_tps: Set[TP]) -> None:
        self._cold = False
        keep = {tp.partition for tp in active_tps} | {tp.partition for tp in standby_tps}
        for k in [k for k, p in self._key_partition.items() if p not in keep]:
            self.data.pop(k, None)
            self._key_partition.pop(k, None)
        for tp in [tp for tp in self._offsets if tp.partition not in keep]:
            del self._offsets[tp]
        self._loaded = {tp for tp in self._loaded if tp.partition in keep}

    def forget(self) -> None:
        """Drop all data and offsets: the next recovery reads whole changelogs."""
        self.data.clear()
        self._key_partition.clear()
        self._offsets.clear()
        self._loaded.clear()
        self._cold = True

    async def on_rebalance(self, assigned: Set[TP], revoked: Set[TP], newly_assigned: Set[TP],
                           generation_id: int = 0) -> None:
        """Before Faust's recovery: read the changelog partitions this worker is
        now active for and holds no exact copy of in bulk, when the transport can
        (pipeline/transport/bulkload.py); Faust then recovers only what came after."""
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)
        transport = self.app.transport
        if not hasattr(transport, "read_changelog"):
            return
        name = self.table.changelog_topic.get_topic_name()
        actives = {tp for tp in self.app.assignor.assigned_actives() if tp.topic == name}
        self._loaded &= actives
        todo = sorted(tp for tp in actives - self._loaded if self.persisted_offset(tp) is None)
        if not todo:
            return
        t0, n = time.monotonic(), 0
        for tp in todo:
            n += await self._load(transport, tp)
        log.info("table %s: %d changelog entries of %d partitions read in bulk in %.2fs",
                 self.table.name, n, len(todo), time.monotonic() - t0)

    async def _load(self, transport: Any, tp: TP) -> int:
        """Replace what this store holds of ``tp``'s partition with its changelog."""
        for k in [k for k, p in self._key_partition.items() if p == tp.partition]:
            self.data.pop(k, None)
            del self._key_partition[k]
        self._offsets.pop(tp, None)
        topic = self.table.changelog_topic
        loads_key, loads_value = self.app.serializers.loads_key, self.app.serializers.loads_value
        ktype, kser, vtype, vser = topic.key_type, topic.key_serializer, topic.value_type, topic.value_serializer
        to_key, to_value = self.table._to_key, self.table._to_value
        data, partitions, p = self.data, self._key_partition, tp.partition
        n, last, bad = 0, None, []
        async for chunk in transport.read_changelog(tp.topic, tp.partition):
            for offset, raw_key, raw_value in chunk:
                last = offset
                try:
                    key = to_key(loads_key(ktype, raw_key, serializer=kser))
                    if raw_value is None:
                        group = [(key, DELETED)]
                    elif is_group(key):
                        # decoded whole before any change is applied: all or none
                        group = list(changes(loads_value(None, raw_value, serializer="json"), to_key, to_value))
                    else:
                        group = [(key, to_value(loads_value(vtype, raw_value, serializer=vser)))]
                except Exception as exc:  # noqa: BLE001 - a bad entry must not stop recovery
                    bad.append((offset, raw_key, raw_value, f"{type(exc).__name__}: {exc}"))
                    continue
                _apply_changes(data, partitions, group, p)
            n += len(chunk)
        if last is not None:
            self._offsets[tp] = last
        self._loaded.add(tp)
        for offset, raw_key, raw_value, why in bad:
            await _dead_letter(self.app, tp, offset, raw_key, raw_value, why)
        return n


def _apply_changes(data: dict, partitions: dict, group: list, partition: int) -> None:
    """Apply ``(key, value)`` changes (``DELETED``: delete) read from ``partition``'s changelog."""
    for k, v in group:
        if v is DELETED:
            data.pop(k, None)
            partitions.pop(k, None)
        else:
            data[k] = v
            partitions[k] = partition


async def _dead_letter(app: Any, tp: TP, offset: int, key: Any, value: Any, why: str) -> None:
    """A changelog entry that does not decode is skipped by recovery and dead-lettered
    (``bad_changelog_entry``), so one entry written there by hand never stops a
    worker from starting (an app without the pipeline's topics: logged only)."""
    from pipeline.entries import send_dead_letter

    declared = getattr(app, "declared", None)
    if declared is None:
        log.warning("skipped a changelog entry of %s at %s: %s", tp, offset, why)
        return
    await send_dead_letter(declared.dlq, tp.topic, "bad_changelog_entry", value, detail=why, key=key,
                           partition=tp.partition, offset=offset)


def _warm_restarts(app: Any) -> bool:
    options = getattr(getattr(app, "_transport", None) or getattr(app, "transport", None), "options", None)
    return getattr(options, "members", "static") == "dynamic"
