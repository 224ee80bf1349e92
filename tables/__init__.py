"""Changelog-backed Faust tables, all partitioned by user_id (they live with the
user's partition of ``notify.intents.<priority>`` and the lanes, and move with it).

=============  ==========================================  ===========================
table          key → value                                 written by
=============  ==========================================  ===========================
preferences    user_id → Preferences                       agents.users (notify.preferences)
devices        user_id → [[platform, token, at], ...]      agents.users (notify.devices)
dedup          "<user>|<biz_key>|*" → [seen, token, category, {channel: [seen, token]}]  agents.guard
daily          "<user>|<category>|<local day>" → count     agents.guard (two days kept)
recent_sends   "<user>|<category>" → [send time, ...]      agents.guard (sliding windows)
timers         timer_id → Timer                            agents.scheduler
=============  ==========================================  ===========================

A dedup entry holds every channel of a (user, business key), written once per
intent; tables written before hold ``"<user>|<biz_key>|<channel>" → [seen, token,
category]``, still read until purged. Dedup and daily keys of expired windows are removed by the guard's purge
(tombstones), and the transport's compactor then drops their history.
"""

from dataclasses import dataclass
from typing import Any

from pipeline.models import Preferences, Timer

__all__ = ["Tables", "define_tables", "put", "remember", "delete"]


@dataclass
class Tables:
    preferences: Any
    devices: Any
    dedup: Any
    daily: Any
    recent_sends: Any
    timers: Any
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
        inflight=app.Table("inflight", default=None, partitions=partitions),
    )


def put(table, partition: int, key, value):
    """Set ``table[key]`` for an event of ``partition`` when no single current event
    applies (batched agents): the changelog entry goes to the user's partition.
    Returns the changelog write's future (it fails with ``ProducerFenced`` when this
    worker no longer owns the partition)."""
    table.data[key] = value
    return table.send_changelog(partition, key, value)


def remember(table, partition: int, key, value) -> None:
    """Set ``table[key]`` for an event of ``partition``, as ``put`` does, but written
    with the table's cached changes at the next commit, after the records of the
    outcomes sent before it (pipeline/transport/cache.py): for a change that says
    the work is done."""
    table.data[key] = value
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
