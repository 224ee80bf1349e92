"""Reading a topic from outside the pipeline (analysts' tools, ``notify outcomes tail``),
from a chosen point, and resuming where a named reader stopped.

A topic is one stream per partition (entry ids ``<offset>-1``, pipeline/transport/
keys.py). A reader starts each partition at:

* ``start``: the oldest entry kept; ``end``: what is written from now on;
* a time (Unix seconds or ISO 8601): the first entry written at or after it (a
  binary search on the entries' ``t`` field, ~20 reads a partition);
* with ``group``: where that group committed last, if it did (else ``start``).

A group's offsets are kept in one hash per group (``Keys.offsets('reader:<name>')``, the layout
the workers used before docs/adr/0004; everything that reads offsets reads it too)
and the group is registered as a reader of the topic, so the transport's trimming
never drops what it has not read (pipeline/transport/retention.py: a reader that
has not committed for 7 days stops holding entries back). Several readers share a
group's partitions with ``member=(i, n)``: reader i of n reads partitions p with
p mod n == i.

On a Redis Cluster each partition's stream is a hash slot of its own, and one XREAD
cannot name keys of two slots: the reader reads each partition with an XREAD of its
own (one pipeline: a round trip per node) and, following, polls every 0.2 s instead
of blocking.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any, Iterator, Optional

import orjson

from pipeline.transport.keys import Keys, after_id, entry_id, offset_of

__all__ = ["TopicReader", "is_cluster_client", "parse_start", "outcome_values"]

#: how long a reader following a topic on a Redis Cluster waits between reads that found nothing
CLUSTER_POLL_S = 0.2


def is_cluster_client(client: Any) -> bool:
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def outcome_values(value: Optional[bytes]) -> list[Optional[bytes]]:
    """The outcomes of one entry of notify.outcomes, each as its JSON object: an
    entry that is a JSON array of objects (one step's outcomes of one user,
    ``outcome_entries = "grouped"``, docs/SCHEMA.md) gives each of them; any other
    entry is given back as it is (one outcome, or something else for the caller
    to refuse)."""
    if value and value[:1] == b"[":
        try:
            items = orjson.loads(value)
        except orjson.JSONDecodeError:
            return [value]
        if items and all(isinstance(i, dict) for i in items):
            return [orjson.dumps(i) for i in items]
    return [value]


def parse_start(text: str) -> Any:
    """``start`` | ``end`` | Unix seconds | ISO 8601 time → "start", "end" or a float time."""
    if text in ("start", "end"):
        return text
    try:
        return float(text)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"--from must be start, end, Unix seconds or an ISO 8601 time, not {text!r}") from None
    return dt.timestamp()


class TopicReader:
    def __init__(self, client: Any, topic: str, partitions: int, *, start: Any = "start",
                 group: Optional[str] = None, member: tuple[int, int] = (0, 1), keys: Keys = Keys()) -> None:
        self.r, self.topic, self.keys = client, topic, keys
        i, n = member
        self.partitions = [p for p in range(partitions) if p % n == i]
        self.group = f"reader:{group}" if group else None
        self.pos: dict[int, int] = {}  # partition → next offset to read
        self._start = start
        self._cluster = is_cluster_client(client)

    # -- where to start ------------------------------------------------------

    def seek(self) -> None:
        committed = {}
        if self.group:
            fields = [self.keys.tp_field(self.topic, p) for p in self.partitions]
            committed = {p: c for p, c in zip(self.partitions, self.r.hmget(self.keys.offsets(self.group), fields))
                         if c is not None}
        for p in self.partitions:
            if p in committed:
                self.pos[p] = int(committed[p])
            elif self._start == "end":
                self.pos[p] = int(self.r.get(self.keys.counter(self.topic, p)) or 0)
            elif self._start == "start":
                self.pos[p] = 0
            else:
                self.pos[p] = self._offset_at(p, float(self._start))

    def _offset_at(self, p: int, at: float) -> int:
        """The first offset of partition ``p`` written at or after ``at``."""
        stream = self.keys.stream(self.topic, p)
        first = self.r.xrange(stream, count=1)
        lo = offset_of(first[0][0]) if first else 0
        hi = int(self.r.get(self.keys.counter(self.topic, p)) or 0)
        while lo < hi:
            mid = (lo + hi) // 2
            got = self.r.xrange(stream, min=entry_id(mid), count=1)
            if not got:
                return hi
            off, fields = offset_of(got[0][0]), got[0][1]
            try:
                t = float(fields.get(b"t", 0))
            except ValueError:
                t = 0.0
            if t < at:
                lo = off + 1
            else:
                hi = off
        return lo

    # -- reading -------------------------------------------------------------

    def read(self, follow: bool = False, count: int = 500) -> Iterator[tuple[int, int, Optional[bytes]]]:
        """(partition, offset, value) in order within each partition; with ``follow``,
        blocks for new entries instead of returning at the end."""
        if not self.pos:
            self.seek()
        by_key = {self.keys.stream(self.topic, p).encode(): p for p in self.partitions}
        while True:
            streams = {self.keys.stream(self.topic, p): after_id(self.pos[p]) for p in self.partitions}
            if self._cluster:
                resp = self._read_each(streams, count)
                if not resp and follow:
                    time.sleep(CLUSTER_POLL_S)
            else:
                resp = self.r.xread(streams, count=count, block=1000 if follow else None) or []
            if not resp and not follow:
                return
            for key, entries in resp:
                p = by_key[key if isinstance(key, bytes) else key.encode()]
                for eid, fields in entries:
                    off = offset_of(eid)
                    self.pos[p] = off + 1
                    yield p, off, fields.get(b"v")

    def _read_each(self, streams: dict, count: int) -> list:
        """One XREAD per stream (a slot each), in one pipeline: the replies of those with entries."""
        pipe = self.r.pipeline(transaction=False)
        for key, after in streams.items():
            pipe.xread({key: after}, count=count)
        return [stream for reply in pipe.execute() for stream in (reply or [])]

    def commit(self) -> None:
        """Remember where the group is (the next offset of each partition)."""
        if not self.group or not self.pos:
            return
        mapping = {self.keys.tp_field(self.topic, p): off for p, off in self.pos.items()}
        pipe = self.r.pipeline(transaction=False)
        pipe.hset(self.keys.offsets(self.group), mapping=mapping)
        pipe.zadd(self.keys.readers(self.topic), {self.group: int(time.time() * 1000)})
        pipe.execute()
