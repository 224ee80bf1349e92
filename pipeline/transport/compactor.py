"""Changelog compaction: Redis does not compact streams, so we do.

Keeps the latest entry per key, drops entries older than the topic's retention
(windowed tables), drops a key's tombstone (its latest entry, without a value)
once it is older than the tombstone grace, and never deletes a partition's tail
entry: Faust recovers a table by reading up to ``highwater - 1`` and would wait
forever for an offset that no longer exists.

Why a grace for tombstones (Kafka's ``delete.retention.ms``): a reader part-way
through the changelog (a worker recovering the partition, a standby) that has
read a key's value must still find the deletion after it. A few minutes covers
any reader that keeps up.

A group entry (:mod:`.groups`: one entry setting or deleting several keys) is
kept while it is the latest entry of one of its keys (or holds the deletion of
one that is not past the tombstone grace), and dropped with the last of them.
A group kept for one key still carries the older values of its other keys, so a
key's tombstone stays, whatever its age, while any kept entry holds an older
value of that key: dropped, replay would bring the value back.

A partition is compacted again only when it is worth it (Kafka's
``min.cleanable.dirty.ratio``): it has grown to twice what the last compaction
kept, or a tombstone it kept has since passed its grace (:class:`Schedule`).
"""

import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

import orjson

from .groups import hashable, raw_changes
from .keys import Keys
from .scripts import DELETE_EXCEPT_TAIL

__all__ = ["Entry", "Plan", "Schedule", "compact_partition", "plan_compaction"]


class Entry(NamedTuple):
    id: bytes
    key: Optional[bytes]
    ts: float
    tombstone: bool = False
    #: a group entry's ``(key, deleted)`` changes (None: a single key's entry)
    group: Optional[list] = None


@dataclass
class Plan:
    doomed: list[bytes]
    kept: int
    #: when the oldest tombstone kept passes its grace (None: none kept)
    tombstone_due: Optional[float] = None


def plan_compaction(
    entries: list[Entry],
    retention_s: Optional[float] = None,
    now: Optional[float] = None,
    tombstone_grace_s: Optional[float] = None,
) -> Plan:
    """What to delete from ``entries`` given in stream order.

    Pure: the tail-protection is applied again inside Lua when deleting.
    ``tombstone_grace_s=None`` keeps tombstones for ever.
    """
    now = time.time() if now is None else now
    cutoff = now - retention_s if retention_s else None
    latest: dict[Any, tuple[Entry, bool]] = {}  # key → (its latest entry, a deletion)
    live: dict[bytes, int] = {}  # group entry → how many keys it is still the latest of
    older: dict[Any, list[bytes]] = {}  # key → the groups holding an older value of it
    doomed: list[bytes] = []

    def superseded(e: Entry) -> None:
        if e.group is None:
            doomed.append(e.id)
            return
        live[e.id] -= 1
        if not live[e.id]:
            doomed.append(e.id)

    for e in entries:
        if cutoff is not None and e.ts < cutoff:
            doomed.append(e.id)
            continue
        if e.group is None:
            changes = [(e.key, e.tombstone)]
        else:
            changes, live[e.id] = e.group, 0
        for key, deleted in changes:
            prev = latest.get(key)
            if prev is not None and prev[0] is e:  # a key listed twice in one group
                latest[key] = (e, deleted)
                continue
            if prev is not None:
                superseded(prev[0])
                if prev[0].group is not None:
                    older.setdefault(key, []).append(prev[0].id)
            latest[key] = (e, deleted)
            if e.group is not None:
                live[e.id] += 1
        if e.group is not None and not live[e.id]:
            doomed.append(e.id)  # an empty group
    tail = entries[-1].id if entries else None
    due: Optional[float] = None
    dropped: dict[Any, Entry] = {}  # key → the entry whose deletion of it goes
    for key, (e, deleted) in latest.items():
        if not deleted or e.id == tail or tombstone_grace_s is None:
            continue
        if e.ts <= now - tombstone_grace_s:
            superseded(e)
            dropped[key] = e
        else:
            due = min(due, e.ts + tombstone_grace_s) if due is not None else e.ts + tombstone_grace_s
    _keep_needed_tombstones(dropped, older, doomed)
    if tail is not None and tail in doomed:
        doomed.remove(tail)  # retention: the tail stays whatever its age
    return Plan(doomed, len(entries) - len(doomed), due)


def _keep_needed_tombstones(dropped: dict, older: dict, doomed: list) -> None:
    """Give back each dropped tombstone whose key some kept group still holds an
    older value of; a tombstone given back may be a group that holds older values
    of other keys, so repeat until nothing changes."""
    gone = set(doomed)
    changed = True
    while changed:
        changed = False
        for key, e in list(dropped.items()):
            if all(g in gone for g in older.get(key, ())):
                continue
            del dropped[key]
            changed = True
            if e.id in gone:
                gone.discard(e.id)
                doomed.remove(e.id)


@dataclass
class Schedule:
    """Which changelog partitions are due for compaction (per worker, in memory:
    after a restart every partition is compacted once)."""

    kept: dict[Any, int] = field(default_factory=dict)
    tombstone_due: dict[Any, float] = field(default_factory=dict)

    def due(self, tp: Any, length: int, now: float) -> bool:
        if tp not in self.kept:
            return length > 1
        if length >= 2 * max(self.kept[tp], 1):
            return True
        t = self.tombstone_due.get(tp)
        return t is not None and now >= t

    def done(self, tp: Any, plan: Plan) -> None:
        self.kept[tp] = plan.kept
        if plan.tombstone_due is None:
            self.tombstone_due.pop(tp, None)
        else:
            self.tombstone_due[tp] = plan.tombstone_due


async def compact_partition(
    client: Any,
    keys: Keys,
    topic: str,
    partition: int,
    *,
    retention_s: Optional[float] = None,
    tombstone_grace_s: Optional[float] = None,
    now: Optional[float] = None,
    chunk: int = 1_000,
) -> Plan:
    """Compact one changelog partition; ``plan.doomed`` is what was deleted.

    Reads ``chunk`` entries per XRANGE and keeps only their ids, keys and times:
    a reply holds the values too, and a worker's memory peaks (which the
    allocator tends to keep as RSS) should stay small; 10,000 decoded entries
    are several MB."""
    stream = keys.stream(topic, partition)
    entries: list[Entry] = []
    start: bytes | str = "-"
    while True:
        batch = await client.xrange(stream, min=start, max="+", count=chunk)
        if not batch:
            break
        entries.extend(_entry(eid, f) for eid, f in batch)
        start = b"(" + batch[-1][0]
        if len(batch) < chunk:
            break
    plan = plan_compaction(entries, retention_s, now, tombstone_grace_s)
    del entries
    script = client.register_script(DELETE_EXCEPT_TAIL)
    deleted = 0
    for i in range(0, len(plan.doomed), 1000):
        deleted += int(await script(keys=[stream], args=plan.doomed[i : i + 1000]))
    return plan


def _entry(eid: bytes, f: dict) -> Entry:
    """A stream entry's id, key, time and kind, the key decoded (JSON; raw bytes when
    it is not) so that a key's own entries and the groups listing it agree."""
    key, value = f.get(b"k"), f.get(b"v")
    group = raw_changes(key, value)
    ts = float(f.get(b"t", 0))
    if group is not None:
        return Entry(eid, key, ts, False, group)
    return Entry(eid, _ident(key), ts, value is None)


def _ident(key: Optional[bytes]) -> Any:
    if key is None:
        return None
    try:
        ident = hashable(orjson.loads(key))
        hash(ident)
        return ident
    except (orjson.JSONDecodeError, TypeError):
        return key
