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
the same key, so the changelog never ends on a stale one. ``tables.remember``
caches a write for an explicit partition (a batched agent's).

A flush (before a commit, on a rebalance, or when too many keys are dirty) takes
the dirty keys first, then waits for what a commit waits for first (the records
of the outcomes sent: agents/sink.py), then sends them: the records of what a
lane did are written before its "done" mark, whose replay would skip the work.
Changes made meanwhile wait for the next flush.

What a flush sends of one partition of a table goes out as one group entry
(:mod:`.groups`) when the table's values allow it: the changes of a commit cost one
stream entry per partition instead of one per key (a lane's "done" marks, the
guard's dedup entries and daily counters), and recovery applies them together at
that place in the changelog, as the separate entries would have been.

Use it with ``faust.App(..., Table=CachedTable)``. Flushing is wired into this
transport (``Producer.flush`` takes and sends the caches); on another transport
(kafka://) nothing calls it, so the cache turns itself off
(:meth:`CachedTable.caching`) and every write goes straight out.
"""

import asyncio
from typing import Any, Optional

import faust

from .groups import DELETED as _DELETED, can_group, encode_changes, group_key
from .hooks import hooks_of

__all__ = ["CachedTable", "cached_tables", "commit_waits", "flush_tables", "MAX_DIRTY"]

#: dirty keys per table before they are sent without waiting for a commit
MAX_DIRTY = 50_000


class CachedTable(faust.Table):
    _dirty: Optional[dict] = None
    _flushing = False

    def caching(self) -> bool:
        """True when the producer flushes table caches (our transport) and the
        table is not windowed (windowed keys carry their own expiry)."""
        return getattr(self.app.producer, "flushes_table_caches", False) and self.window is None

    def get(self, key: Any, default: Any = None) -> Any:
        """``table.get(key)`` read from the store: what ``Mapping.get`` answers for a
        table without a default nor a window, without its four Python layers
        (``__getitem__``, the sensors' ``on_table_get``, ``__missing__``'s
        ``KeyError``): 0.8-1.5 µs against 0.25, several reads per notification. No
        sensor hears of the read (our workers run without Faust's Monitor:
        pipeline/lean.py). A table with a default or a window keeps Faust's."""
        if self.default is None and self.window is None:
            return self.data.get(key, default)
        return super().get(key, default)

    def on_key_set(self, key: Any, value: Any) -> None:
        if not self.caching():
            return super().on_key_set(key, value)
        self._remember(self.partition_for_key(key), key, value)

    def on_key_del(self, key: Any) -> None:
        if not self.caching():
            return super().on_key_del(key)
        self._remember(self.partition_for_key(key), key, _DELETED)

    def remember(self, partition: int, key: Any, value: Any) -> None:
        """Cache a change of ``key`` (already set in the store) for ``partition``."""
        self._remember(partition, key, value)

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
        if len(self._dirty) >= MAX_DIRTY and not self._flushing:
            self._flushing = True
            asyncio.ensure_future(self._flush_early())

    async def _flush_early(self) -> None:
        """Too many dirty keys: send them without waiting for a commit (but after
        what a commit waits for first, as a commit's flush does)."""
        try:
            await self.flush_durably()
        finally:
            self._flushing = False

    def send_changelog(self, partition: Optional[int], key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
        if self._dirty:
            self._dirty.pop((partition, key), None)  # this write is newer
        return super().send_changelog(partition, key, value, *args, **kwargs)

    def send_group(self, partition: int, items: list[tuple[Any, Any]], *, _taken: bool = False) -> Any:
        """Send the ``(key, value)`` changes (value ``groups.DELETED``: delete) of
        ``partition`` as one changelog entry when the table allows it
        (:func:`.groups.can_group`), else one entry per key; returns the future of
        the (last) write. Each key's cached older change is dropped, as
        :meth:`send_changelog` does (not for what a flush took: the cache holds
        only newer changes then)."""
        send = super().send_changelog if _taken else self.send_changelog
        if len(items) > 1 and can_group(self):
            if self._dirty and not _taken:
                for key, _v in items:
                    self._dirty.pop((partition, key), None)
            return super().send_changelog(partition, group_key(), encode_changes(items))
        fut = None
        for key, value in items:
            if value is _DELETED:
                fut = send(partition, key, None, value_serializer="raw")
            else:
                fut = send(partition, key, value)
        return fut

    def take_cache(self) -> Optional[dict]:
        """The dirty keys so far, taken out of the cache (later changes start a new one)."""
        dirty, self._dirty = self._dirty, None
        return dirty

    def send_taken(self, dirty: Optional[dict]) -> int:
        """Send what :meth:`take_cache` took, each key's change only if it is still
        the key's latest (a newer one is cached again or was sent directly, and
        sending the older after it would leave the changelog on a stale value)."""
        if not dirty:
            return 0
        data = self.data
        parts: dict[int, list] = {}
        for (partition, key), value in dirty.items():
            if value is _DELETED:
                if key in data:
                    continue
                parts.setdefault(partition, []).append((key, _DELETED))
            else:
                if data.get(key, _DELETED) is not value:
                    continue
                parts.setdefault(partition, []).append((key, value))
        for partition, items in parts.items():
            self.send_group(partition, items, _taken=True)
        return sum(len(items) for items in parts.values())

    async def flush_durably(self) -> int:
        """:func:`flush_tables` for this table alone."""
        return await flush_tables(self.app, [self])

    async def on_rebalance(self, assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0) -> None:
        # what was cached for the partitions being revoked goes out now (Faust
        # committed before revoking; a write to a partition lost meanwhile is fenced)
        await self.flush_durably()
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)


async def commit_waits(app: Any) -> None:
    """Await what must be durable before a commit, and before any cached table change
    is sent (the sinks of the transport hooks: the records of the outcomes sent, agents/sink.py)."""
    await hooks_of(app).flush_sinks()


def cached_tables(app: Any) -> list:
    return [t for t in app.tables.values() if isinstance(t, CachedTable)]


async def flush_tables(app: Any, tables: Any) -> int:
    """Send the dirty keys the tables hold now once what a commit waits for first is
    done (:func:`commit_waits`): a change that says work is done must not be durable
    before that work's records are. Changes made meanwhile wait for the next flush.
    Returns how many were sent."""
    taken = [(t, t.take_cache()) for t in tables]
    await commit_waits(app)
    return sum(t.send_taken(dirty) for t, dirty in taken)
