"""Group entries: one changelog entry that sets or deletes several keys of a table.

A table change is one changelog entry per key (Faust's model). When an agent
changes many keys of one partition at once (the changes of a commit, the lanes'
"calling" marks of one take), writing them as one entry costs one stream entry,
one write and one read on recovery instead of one per key, and applies them
together: recovery sets the keys in the order they are listed, at the entry's
place in the changelog, exactly as the separate entries would have (and never
only some of them).

The entry's key is ``["~g", <id>]`` (a JSON array: the pipeline's table keys are
strings, so it never collides with one; the id keeps it unique, so a compaction
by key never takes one group for another), its value the list of changes, each
``[key, value]`` or ``[key]`` for a deletion. Only tables whose values are plain
JSON (no ``value_type``) and whose store expands groups (tables/store.py,
``applies_groups``) are written this way, and only on this transport, whose
compactor (:mod:`.compactor`) keeps a group entry while one of its keys has no
later entry. Elsewhere the changes go out one entry per key.
"""

from __future__ import annotations

import itertools
import os
from typing import Any, Iterable, Iterator, Optional

import orjson

__all__ = ["MARK", "DELETED", "group_key", "is_group", "encode_changes", "changes", "raw_changes", "entry_changes",
           "can_group"]

MARK = "~g"

#: a change that deletes its key
DELETED = object()

_ids = itertools.count()
_prefix = os.urandom(4).hex()


def group_key() -> list:
    """A fresh key for a group entry (unique per process and, with the random
    prefix, across processes)."""
    return [MARK, f"{_prefix}{next(_ids):x}"]


def is_group(key: Any) -> bool:
    """Whether a decoded changelog key (a list, or the tuple Faust's tables make of
    it) is a group entry's."""
    return isinstance(key, (list, tuple)) and len(key) == 2 and key[0] == MARK


def encode_changes(items: Iterable[tuple[Any, Any]]) -> list:
    """The value of a group entry of ``(key, value)`` changes (``DELETED``: delete)."""
    return [[k] if v is DELETED else [k, v] for k, v in items]


def changes(value: Any, to_key: Any = None, to_value: Any = None) -> Iterator[tuple[Any, Any]]:
    """The ``(key, value)`` changes of a decoded group value, in order (``DELETED``
    for a deletion); ``to_key`` / ``to_value`` as the table's."""
    for item in value or ():
        k = to_key(item[0]) if to_key else item[0]
        if len(item) < 2:
            yield k, DELETED
        else:
            yield k, to_value(item[1]) if to_value else item[1]


def raw_changes(raw_key: Optional[bytes], raw_value: Optional[bytes]) -> Optional[list[tuple[Any, bool]]]:
    """For a stream entry as stored (``k`` and ``v`` fields): None when it is not a
    group entry, else its ``(key, deleted)`` changes, keys decoded (lists as tuples,
    as Faust's tables make them). The compactor's view."""
    if not raw_key or not raw_key.startswith(b'["~g"') or raw_value is None:
        return None
    try:
        key = orjson.loads(raw_key)
        if not is_group(key):
            return None
        group = [(k, v is DELETED) for k, v in changes(orjson.loads(raw_value), hashable)]
        for k, _d in group:
            hash(k)
        return group
    except (orjson.JSONDecodeError, TypeError, IndexError):
        return None


def entry_changes(fields: dict) -> list[tuple[Any, Any]]:
    """The ``(key, value)`` changes of a changelog stream entry as stored (its fields,
    JSON keys and values decoded; value None: a deletion), one for an ordinary entry,
    those it lists for a group entry. For tools and tests that read a changelog."""
    raw_key, raw_value = fields.get(b"k"), fields.get(b"v")
    key = None if raw_key is None else hashable(orjson.loads(raw_key))
    if raw_value is None:
        return [(key, None)]
    value = orjson.loads(raw_value)
    if is_group(key):
        return [(k, None if v is DELETED else v) for k, v in changes(value, hashable)]
    return [(key, value)]


def hashable(k: Any) -> Any:
    """A decoded JSON key as a dict key (Faust's ``Table._to_key``: lists become tuples)."""
    if isinstance(k, list):
        return tuple(tuple(v) if isinstance(v, list) else v for v in k)
    return k


def can_group(table: Any) -> bool:
    """Whether ``table``'s changes may go out as group entries: plain JSON values,
    a store that expands them, and a changelog on a transport whose compactor
    knows them (the cache's test: :meth:`CachedTable.caching`)."""
    caching = getattr(table, "caching", None)
    return (table.value_type is None and getattr(table.data, "applies_groups", False)
            and caching is not None and caching())
