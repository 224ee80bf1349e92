"""A table whose changelog writes wait for the next commit (Kafka Streams' record
cache): ``table[k] = v`` updates the local store at once and remembers ``(partition,
k)`` as dirty; the latest value of each dirty key is sent to the changelog when
the producer is flushed, which Faust does right before every offset commit (and
on rebalance and stop). A key written a hundred times between two commits costs
one changelog entry instead of a hundred.

Why it keeps the guarantees: an offset is committed only after the flush, so
every change made by the events up to that offset is in the changelog first. A
crash loses cached changes and the uncommitted offsets together; the events are
replayed and make them again (at least once, as before).

What bypasses the cache: :meth:`send_changelog` called directly (the
``tables.put`` / ``tables.delete`` helpers: writes that must be durable before a
side effect, like the lanes' "calling" marks); it drops a cached older value of
the same key, so the changelog never ends on a stale one.

Use it with ``faust.App(..., Table=CachedTable)``. Flushing is wired into this
transport (``Producer.flush`` calls :func:`flush_caches`); on another transport
(kafka://) nothing calls it, so the cache turns itself off
(:meth:`CachedTable.caching`) and every write goes straight out.
"""

from typing import Any, Optional

import faust

__all__ = ["CachedTable", "flush_caches", "MAX_DIRTY"]

#: dirty keys per table before they are sent without waiting for a commit
MAX_DIRTY = 50_000

_DELETED = object()


class CachedTable(faust.Table):
    _dirty: Optional[dict] = None

    def caching(self) -> bool:
        """True when the producer flushes table caches (our transport) and the
        table is not windowed (windowed keys carry their own expiry)."""
        return getattr(self.app.producer, "flushes_table_caches", False) and self.window is None

    def on_key_set(self, key: Any, value: Any) -> None:
        if not self.caching():
            return super().on_key_set(key, value)
        self._remember(self.partition_for_key(key), key, value)

    def on_key_del(self, key: Any) -> None:
        if not self.caching():
            return super().on_key_del(key)
        self._remember(self.partition_for_key(key), key, _DELETED)

    def _remember(self, partition: Optional[int], key: Any, value: Any) -> None:
        if partition is None:  # use_partitioner: the producer picks it, no cache
            if value is _DELETED:
                super().send_changelog(None, key, None, value_serializer="raw")
            else:
                super().send_changelog(None, key, value)
            return
        if self._dirty is None:
            self._dirty = {}
        self._dirty[(partition, key)] = value
        if len(self._dirty) >= MAX_DIRTY:
            self.flush_cache()

    def send_changelog(self, partition: Optional[int], key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        if self._dirty:
            self._dirty.pop((partition, key), None)  # this write is newer
        return super().send_changelog(partition, key, value, *args, **kwargs)

    def flush_cache(self) -> int:
        """Send the latest value of every dirty key; returns how many."""
        dirty, self._dirty = self._dirty, None
        if not dirty:
            return 0
        send = super().send_changelog
        for (partition, key), value in dirty.items():
            if value is _DELETED:
                send(partition, key, None, value_serializer="raw")
            else:
                send(partition, key, value)
        return len(dirty)

    async def on_rebalance(self, assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0) -> None:
        # what was cached for the partitions being revoked goes out now (Faust
        # committed before revoking; a write to a partition lost meanwhile is fenced)
        self.flush_cache()
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)


def flush_caches(app: Any) -> int:
    """Send every cached table change (called by the producer's flush)."""
    n = 0
    for table in app.tables.values():
        flush = getattr(table, "flush_cache", None)
        if flush is not None:
            n += flush()
    return n
