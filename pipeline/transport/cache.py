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
from faust.models.base import Model
from faust.serializers.codecs import get_codec

from .groups import DELETED as _DELETED, can_group, encode_changes, group_key
from .hooks import hooks_of

__all__ = ["CachedTable", "cached_tables", "commit_waits", "flush_tables", "MAX_DIRTY"]

#: dirty keys per table before they are sent without waiting for a commit
MAX_DIRTY = 50_000
#: keys and values Faust's registry does not hand to the table's codec (bytes as they
#: are, a record by its own serializer): these take Faust's ``prepare_key``/``prepare_value``
_AS_IS = (bytes, Model)


class CachedTable(faust.Table):
    _dirty: Optional[dict] = None
    _flushing = False
    #: :meth:`_codecs`' answer once found (False: not yet)
    _direct_codecs: Any = False

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
            store = self._data  # Faust's ``data`` property, without its call once the store exists
            return (store if store is not None else self.data).get(key, default)
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
        return self._send(partition, key, value, *args, **kwargs)

    def _send(self, partition: Optional[int], key: Any, value: Any,
              key_serializer: Any = None, value_serializer: Any = None) -> Any:
        """Faust's ``Collection.send_changelog``: the same entry (key and value
        serialized by the changelog topic's schema, as Faust does), handed to our
        producer with a plain future, without Faust's pending and future message,
        its sensor calls and its callback per entry (a lane's "calling" marks: one
        entry per take, awaited before the calls). Once written, the store learns
        the entry's offset, as Faust's ``_on_changelog_sent`` tells it. Faust's own
        path where ours does not apply: another producer (or Faust's threaded one),
        no explicit partition, a transaction."""
        producer = self.app.producer
        enqueue = getattr(producer, "enqueue_entry", None)
        if enqueue is None or partition is None or self.app.in_transaction or not producer.writes_directly():
            return super().send_changelog(partition, key, value, key_serializer, value_serializer)
        topic = self.changelog_topic
        plain = (key_serializer is None and value_serializer is None and value is not None
                 and not isinstance(key, _AS_IS) and not isinstance(value, _AS_IS))
        codecs = self._codecs() if plain else None
        if codecs is not None:  # the common change: a plain key and value, the table's codecs
            k, v, headers = codecs[0].dumps(key), codecs[1].dumps(value), {}
        else:
            k, headers = topic.prepare_key(key, key_serializer or self.key_serializer, None, {})
            v, headers = topic.prepare_value(value, value_serializer or self.value_serializer, None, headers)
        fut = enqueue(topic.get_topic_name(), partition, k, v, headers)
        fut.add_done_callback(self._on_sent)
        return fut

    def _codecs(self) -> Optional[tuple]:
        """The codecs Faust's registry picks for this changelog's plain keys and values
        (``Registry.dumps_key``/``dumps_value`` with the table's serializers), found
        once; None where it would not use one (they go through ``prepare_key``)."""
        found = self._direct_codecs
        if found is False:
            schema, reg = self.changelog_topic.schema, self.app.serializers
            ks = reg._serializer(schema.key_type, self.key_serializer or schema.key_serializer, reg.key_serializer)
            vs = reg._serializer(schema.value_type, self.value_serializer or schema.value_serializer,
                                 reg.value_serializer)
            found = (get_codec(ks), get_codec(vs)) if ks and vs else None
            self._direct_codecs = found
        return found

    def _on_sent(self, fut: "asyncio.Future") -> None:
        if not fut.cancelled() and fut.exception() is None:
            md = fut.result()
            self.data.set_persisted_offset(md.topic_partition, md.offset)

    def send_group(self, partition: int, items: list[tuple[Any, Any]], *, _taken: bool = False) -> Any:
        """Send the ``(key, value)`` changes (value ``groups.DELETED``: delete) of
        ``partition`` as one changelog entry when the table allows it
        (:func:`.groups.can_group`), else one entry per key; returns the future of
        the (last) write. Each key's cached older change is dropped, as
        :meth:`send_changelog` does (not for what a flush took: the cache holds
        only newer changes then)."""
        send = self._send if _taken else self.send_changelog
        if len(items) > 1 and can_group(self):
            if self._dirty and not _taken:
                for key, _v in items:
                    self._dirty.pop((partition, key), None)
            return self._send(partition, group_key(), encode_changes(items))
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
