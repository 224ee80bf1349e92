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

from typing import Any, Callable, Iterable, Optional, Set

from faust import current_event
from faust.stores import memory
from faust.types import TP, EventT

__all__ = ["Store"]


class Store(memory.Store):
    def __post_init__(self) -> None:
        super().__post_init__()
        self._offsets: dict[TP, int] = {}
        #: set by forget() until the next recovery completed: a changelog batch
        #: still in flight may land after forget() and must not make its offset
        #: look like a warm copy
        self._cold = False

    def apply_changelog_batch(
        self,
        batch: Iterable[EventT],
        to_key: Callable[[Any], Any],
        to_value: Callable[[Any], Any],
    ) -> None:
        data, partitions, offsets = self.data, self._key_partition, self._offsets
        for event in batch:
            key = to_key(event.key)
            message = event.message
            if message.value is None:
                data.pop(key, None)
                partitions.pop(key, None)
            else:
                data[key] = to_value(event.value)
                partitions[key] = message.partition
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

    def __delitem__(self, key: Any) -> None:
        del self.data[key]
        self._key_partition.pop(key, None)

    def persisted_offset(self, tp: TP) -> Optional[int]:
        """Offset of the last changelog entry this store holds for ``tp`` (or None).

        Only with dynamic membership (the elastic consumer forgets the state of
        a fenced member); otherwise None, and recovery reads whole changelogs.
        """
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

    def forget(self) -> None:
        """Drop all data and offsets: the next recovery reads whole changelogs."""
        self.data.clear()
        self._key_partition.clear()
        self._offsets.clear()
        self._cold = True


def _warm_restarts(app: Any) -> bool:
    options = getattr(getattr(app, "_transport", None) or getattr(app, "transport", None), "options", None)
    return getattr(options, "members", "static") == "dynamic"
