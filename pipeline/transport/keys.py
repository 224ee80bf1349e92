"""Key layout of the Redis Streams transport.

Every key of one topic-partition shares the hash tag ``{<topic>|<p>}`` and every
key of one consumer group shares ``{g|<group>}``, so each Lua script touches a
single hash slot and the same code runs on Redis Cluster.

    <ns>:{<topic>|<p>}:s      stream, entry ids ``<offset>-1`` (dense offsets)
    <ns>:{<topic>|<p>}:n      next offset to assign (= highwater)
    <ns>:{<topic>|<p>}:f      fencing token allowed to write (changelogs only)
    <ns>:topics               hash topic → partition count
    <ns>:readers:<topic>      sorted set group → last seen (ms): who holds the topic's entries
    <ns>:supervisor           hash "<host>/<process>" → JSON state (pipeline/supervise.py)
    <ns>:breakers             hash "<host>/<worker>/<provider>" → JSON {state, since} (pipeline/breakers.py)
    <ns>:{g|<group>|<p>}:offsets  hash "<topic>|<p>" → committed offset (next to read), and
                              "<topic>|<p>@" → the token that wrote it: one hash per
                              partition index, so commits spread over a cluster's masters
                              (docs/adr/0004-group-state-by-partition.md)
    <ns>:{g|<group>|<p>}:fence    hash fence field → token: the commit fence's copy
                              next to those offsets (committed.py)
    <ns>:{g|<group>}:offsets  hash "<topic>|<p>" → committed offset: the layout before
                              ADR 0004, still read (the larger wins) and still written
                              by analysts' readers (pipeline/reader.py)
    <ns>:{g|<group>}:lease:<slot>   owner token, expires (PX) unless renewed
    <ns>:{g|<group>}:fence    hash slot → token of the slot's current owner
    <ns>:{g|<group>}:gens     hash slot → generation counter
    <ns>:{g|<group>}:members  hash worker id → last heartbeat (ms), for `notify status`

Dynamic membership (``?members=dynamic``, see :mod:`.membership`):

    <ns>:{g|<group>}:mm:live    zset member id → lease deadline (server ms)
    <ns>:{g|<group>}:mm:info    hash member id → JSON {topics, url} (subscription)
    <ns>:{g|<group>}:mm:acks    hash member id → generation it revoked for
    <ns>:{g|<group>}:mm:state   hash gen, changed_at, sync_deadline, rebalances, expelled
    <ns>:{g|<group>}:mm:assign  hash gen, leader, at, duration_ms, <member> → JSON
                                ClientAssignment (written once per generation)

In that mode the group fence hash holds "<topic>|<p>" → "<member>:<gen>".
"""

import functools
from dataclasses import dataclass

__all__ = ["Keys", "entry_id", "offset_of"]


def entry_id(offset: int) -> bytes:
    """Stream id of ``offset``: ``<offset>-1`` (``0-0`` is not a valid id)."""
    return b"%d-1" % offset


def after_id(position: int) -> bytes:
    """XREAD id that returns entries from ``position`` (next offset to read) on."""
    return b"%d-1" % (position - 1) if position > 0 else b"0-0"


def offset_of(stream_id: bytes) -> int:
    return int(stream_id.split(b"-", 1)[0])


@dataclass(frozen=True)
class Keys:
    ns: str = "nfs"

    def tag(self, topic: str, partition: int) -> str:
        return f"{self.ns}:{{{topic}|{partition}}}"

    def stream(self, topic: str, partition: int) -> str:
        return f"{self.tag(topic, partition)}:s"

    def counter(self, topic: str, partition: int) -> str:
        return f"{self.tag(topic, partition)}:n"

    def fence(self, topic: str, partition: int) -> str:
        return f"{self.tag(topic, partition)}:f"

    @functools.lru_cache(maxsize=4096)  # noqa: B019 - a few hundred partitions, and Keys lives as long
    def produce_keys(self, topic: str, partition: int) -> tuple[str, str, str]:
        """PRODUCE's KEYS of a partition (stream, counter, fence), made once."""
        return self.stream(topic, partition), self.counter(topic, partition), self.fence(topic, partition)

    @property
    def topics(self) -> str:
        return f"{self.ns}:topics"

    @property
    def breakers(self) -> str:
        return f"{self.ns}:breakers"

    @property
    def releases(self) -> str:
        """Gray releases set through the API: name → JSON (pipeline/rules/release.py)."""
        return f"{self.ns}:releases"

    @property
    def supervisor(self) -> str:
        return f"{self.ns}:supervisor"

    def readers(self, topic: str) -> str:
        return f"{self.ns}:readers:{topic}"

    def group(self, group: str) -> str:
        return f"{self.ns}:{{g|{group}}}"

    def offsets(self, group: str) -> str:
        """The group's committed offsets in one hash (the layout before ADR 0004)."""
        return f"{self.group(group)}:offsets"

    def commit_tag(self, group: str, partition: int) -> str:
        return f"{self.ns}:{{g|{group}|{partition}}}"

    def commits(self, group: str, partition: int) -> str:
        """The group's committed offsets of every topic's partition ``partition``."""
        return f"{self.commit_tag(group, partition)}:offsets"

    def commit_fence(self, group: str, partition: int) -> str:
        """The copy of the group's fence tokens its commits of ``partition`` check."""
        return f"{self.commit_tag(group, partition)}:fence"

    def lease(self, group: str, slot: int) -> str:
        return f"{self.group(group)}:lease:{slot}"

    def group_fence(self, group: str) -> str:
        return f"{self.group(group)}:fence"

    def gens(self, group: str) -> str:
        return f"{self.group(group)}:gens"

    def members(self, group: str) -> str:
        return f"{self.group(group)}:members"

    def member_keys(self, group: str) -> list[str]:
        """KEYS of the membership scripts: live, info, acks, state, assign, fence."""
        g = self.group(group)
        return [f"{g}:mm:live", f"{g}:mm:info", f"{g}:mm:acks", f"{g}:mm:state", f"{g}:mm:assign",
                self.group_fence(group)]

    @staticmethod
    def tp_field(topic: str, partition: int) -> str:
        return f"{topic}|{partition}"
