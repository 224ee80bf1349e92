"""Key layout of the Redis Streams transport.

Every key of one topic-partition shares the hash tag ``{<topic>|<p>}`` and every
key of one consumer group shares ``{g|<group>}``, so each Lua script touches a
single hash slot and the same code runs on Redis Cluster.

    <ns>:{<topic>|<p>}:s      stream, entry ids ``<offset>-1`` (dense offsets)
    <ns>:{<topic>|<p>}:n      next offset to assign (= highwater)
    <ns>:{<topic>|<p>}:f      fencing token allowed to write (changelogs only)
    <ns>:topics               hash topic → partition count
    <ns>:readers:<topic>      sorted set group → last seen (ms): who holds the topic's entries
    <ns>:{g|<group>}:offsets  hash "<topic>|<p>" → committed offset (next to read)
    <ns>:{g|<group>}:lease:<slot>   owner token, expires (PX) unless renewed
    <ns>:{g|<group>}:fence    hash slot → token of the slot's current owner
    <ns>:{g|<group>}:gens     hash slot → generation counter
    <ns>:{g|<group>}:members  hash worker id → last heartbeat (ms), for `notify status`
"""

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

    @property
    def topics(self) -> str:
        return f"{self.ns}:topics"

    def readers(self, topic: str) -> str:
        return f"{self.ns}:readers:{topic}"

    def group(self, group: str) -> str:
        return f"{self.ns}:{{g|{group}}}"

    def offsets(self, group: str) -> str:
        return f"{self.group(group)}:offsets"

    def lease(self, group: str, slot: int) -> str:
        return f"{self.group(group)}:lease:{slot}"

    def group_fence(self, group: str) -> str:
        return f"{self.group(group)}:fence"

    def gens(self, group: str) -> str:
        return f"{self.group(group)}:gens"

    def members(self, group: str) -> str:
        return f"{self.group(group)}:members"

    @staticmethod
    def tp_field(topic: str, partition: int) -> str:
        return f"{topic}|{partition}"
