"""The in-memory table store, with changelog batches applied in order.

Faust's ``memory://`` store applies a recovery batch's sets first and its deletes
after, keeping a re-set key only if its new value is truthy: a key deleted and
then set to ``0``, ``""`` or ``[]`` in the same batch is lost on recovery (found
by the transport's property test of table recovery). This store applies every
entry in changelog order. Registered on the ``faust.stores`` entry point as
``memory-ordered``: ``store="memory-ordered://"``.
"""

from typing import Any, Callable, Iterable

from faust.stores import memory
from faust.types import EventT

__all__ = ["Store"]


class Store(memory.Store):
    def apply_changelog_batch(
        self,
        batch: Iterable[EventT],
        to_key: Callable[[Any], Any],
        to_value: Callable[[Any], Any],
    ) -> None:
        data, partitions = self.data, self._key_partition
        for event in batch:
            key = to_key(event.key)
            if event.message.value is None:
                data.pop(key, None)
                partitions.pop(key, None)
            else:
                data[key] = to_value(event.value)
                partitions[key] = event.message.partition
