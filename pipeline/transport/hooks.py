"""What an app tells the transport beyond Faust's own settings, typed and in one
place: the app passes a :class:`TransportHooks` to its constructor
(pipeline/app.py ``NotifyApp``); a plain Faust app has none and gets the
defaults (:func:`hooks_of`), so the transport stays usable by any Faust app.

The transport imports nothing of the project: what it reports (rebalances, an
expelled member) goes out through the callbacks here.

Checkpoint order (as quixstreams: sinks, then producer, then offsets): a commit
first awaits every sink's ``flush()`` (the record store: the records of the
outcomes sent), then the tables' cached changes and the producer's pending
messages, then writes the offsets. A table change that says work is done must
not be durable before that work's records are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Protocol

__all__ = ["Sink", "TransportHooks", "hooks_of"]


class Sink(Protocol):
    """Something a commit waits for: ``flush()`` returns once what was handed to it
    before the call is durable."""

    async def flush(self) -> None: ...


@dataclass
class TransportHooks:
    #: topics read and written apart (their own fetch loop and producer queue:
    #: pipeline/transport/priority.py)
    priority_topics: frozenset = frozenset()
    #: topic → other consumer groups that read it when the deployment runs the other
    #: way; a seek starts from the furthest of theirs and ours (consumer.py)
    offset_peers: Mapping[str, tuple] = field(default_factory=dict)
    #: flushed, in order, before the producer's flush and every commit
    sinks: list = field(default_factory=list)
    #: topics the app writes and no agent reads: trimmed by age, never past what any
    #: reader group committed (retention.py)
    trim_written: frozenset = frozenset()
    #: (seconds, generation) after each completed rebalance of an elastic group
    on_rebalance: Optional[Callable[[float, int], None]] = None
    #: this member was expelled from its group (missed its heartbeats)
    on_expelled: Optional[Callable[[], None]] = None
    #: (topic, partition, committed, end): a seek found the group's committed offset
    #: past the partition's end (the stream rolled back: AOF everysec, a failover)
    #: and repaired it (integrity.py); called once per partition and repair
    on_offset_rollback: Optional[Callable[[str, int, int, int], None]] = None

    async def flush_sinks(self) -> None:
        for sink in self.sinks:
            await sink.flush()


_DEFAULT = TransportHooks()


def hooks_of(app: Any) -> TransportHooks:
    """The app's hooks, or the defaults for an app that has none."""
    hooks = getattr(app, "transport_hooks", None)
    return hooks if isinstance(hooks, TransportHooks) else _DEFAULT

