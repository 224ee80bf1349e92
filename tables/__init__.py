"""Changelog-backed Faust tables, all partitioned by user_id (they live with the
user's partition of ``notify.intents.<priority>`` and the lanes, and move with it).

=============  ==========================================  ===========================
table          key → value                                 written by
=============  ==========================================  ===========================
preferences    user_id → Preferences                       agents.users (notify.preferences)
devices        user_id → [[platform, token, at], ...]      agents.users (notify.devices)
dedup          "<user>|<biz_key>|*" → [seen, token, category, {channel: [seen, token]}]  agents.guard
               ("daily", "freq:<user>:<category>:<local day>") → count  (two days kept)
               ("window", "<user>|<category>") → [send time, ...]  (sliding windows)
daily          as ("daily", key) above, written before    read and purged only
recent_sends   as ("window", key) above, written before   read and purged only
timers         timer_id → Timer                            agents.scheduler
timers_high    as timers, of notify.timers.high            agents.scheduler (scheduler.high)
=============  ==========================================  ===========================

A dedup entry holds every channel of a (user, business key), written once per
intent; tables written before hold ``"<user>|<biz_key>|<channel>" → [seen,
token, category]``, still read until purged. A user's daily counters and window
times are in the same table, so what one commit changes of a user's guard state
is one changelog entry, durable or lost together (agents/guard.py). Dedup and
daily keys of expired windows are removed by the guard's purge (tombstones), and
the transport's compactor then drops their history.

The changes of a partition that go out together (a commit's cached changes, a
take's "calling" marks: :func:`put_many`, a purge's tombstones) are one changelog
entry for the tables with plain JSON values (pipeline/transport/groups.py).
"""

from dataclasses import dataclass
from typing import Any

from pipeline.models import Preferences, Timer
from pipeline.transport.groups import DELETED

__all__ = ["Tables", "define_tables", "put", "put_many", "remember", "delete", "DELETED"]


@dataclass
class Tables:
    preferences: Any
    devices: Any
    dedup: Any
    daily: Any
    recent_sends: Any
    timers: Any
    timers_high: Any  # the timers of notify.timers.high (the high path's retries)
    #: delivery_id → {"a": attempt, "s": state} written durably *before* a provider call
    #: ("calling") and after it; a replayed delivery found "calling" is reconciled by
    #: querying the providers, never blindly resent. (The inbox's lane keeps none:
    #: agents/lanes.py ``marks_calls``.)
    inflight: Any


def define_tables(app: Any, partitions: int) -> Tables:
    """The tables of ``app`` (pipeline/app.py ``create_app``), ``partitions`` each."""
    return Tables(
        preferences=app.Table("preferences", default=None, value_type=Preferences, partitions=partitions),
        devices=app.Table("devices", default=None, partitions=partitions),
        dedup=app.Table("dedup", default=None, partitions=partitions),
        daily=app.Table("daily", default=int, partitions=partitions),
        recent_sends=app.Table("recent_sends", default=None, partitions=partitions),
        timers=app.Table("timers", default=None, value_type=Timer, partitions=partitions),
        timers_high=app.Table("timers_high", default=None, value_type=Timer, partitions=partitions),
        inflight=app.Table("inflight", default=None, partitions=partitions),
    )


def _set(table, partition: int, key, value) -> None:
    """``table[key] = value`` in memory, the key counted as ``partition``'s (the
    user's), so that it goes with that partition when it is given up
    (tables/store.py ``Store.put_in``; a plain Faust store knows no better)."""
    store = table.data
    put_in = getattr(store, "put_in", None)
    if put_in is None:
        store[key] = value
    else:
        put_in(partition, key, value)


def put(table, partition: int, key, value):
    """Set ``table[key]`` for an event of ``partition`` when no single current event
    applies (batched agents): the changelog entry goes to the user's partition.
    Returns the changelog write's future (it fails with ``ProducerFenced`` when this
    worker no longer owns the partition)."""
    _set(table, partition, key, value)
    return table.send_changelog(partition, key, value)


def put_many(table, partition: int, items: dict):
    """``put`` for several keys of one partition (``{key: value}``, ``DELETED`` to
    delete): one changelog entry for them all where the table allows it
    (pipeline/transport/groups.py), written before anything sent after it, as
    ``put``'s. Returns the write's future (None for no items)."""
    send_group = getattr(table, "send_group", None)
    if send_group is None:  # a plain Faust table: one entry per key
        fut = None
        for key, value in items.items():
            fut = delete(table, partition, key) if value is DELETED else put(table, partition, key, value)
        return fut
    if not items:
        return None
    data = table.data
    for key, value in items.items():
        if value is DELETED:
            data.pop(key, None)
        else:
            _set(table, partition, key, value)
    return send_group(partition, list(items.items()))


def remember(table, partition: int, key, value) -> None:
    """Set ``table[key]`` for an event of ``partition``, as ``put`` does, but written
    with the table's cached changes at the next commit, after the records of the
    outcomes sent before it (pipeline/transport/cache.py): for a change that says
    the work is done."""
    _set(table, partition, key, value)
    if table.caching():
        table.remember(partition, key, value)
    else:
        table.send_changelog(partition, key, value)


def delete(table, partition: int, key):
    """Delete ``table[key]`` with a tombstone on ``partition``; returns the write's future."""
    if key in table.data:
        del table.data[key]
    # "raw" as Faust's own deletes: a real tombstone (no value), not JSON "null"
    return table.send_changelog(partition, key, None, value_serializer="raw")
