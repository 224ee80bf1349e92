"""The record store: delivery records, attempts and the in-app inbox, on SQLite.

One layer per file:

* ``schema.py``: the tables (DDL, described there), column lists and row field
  positions, the SQL of the order-free merge (upsert) and of the migration;
* ``merge.py``: how a batch of outcomes becomes row values (state precedence,
  first-seen times, one row per record and per device delivery), no I/O;
* ``store.py``: :class:`RecordStore` (open, pragmas, migration, writes,
  queries), :class:`StoreUnavailable`, :class:`InvalidOutcome`,
  :class:`InboxItem`, :func:`is_transient`;
* ``devices.py``: a push's deliveries to each device, and the record's state
  derived from them.

The names the rest of the code uses are importable from here:
``from pipeline.store import RecordStore, StoreUnavailable, ...``.
"""

from __future__ import annotations

from .schema import ATTEMPT_COLUMNS, RECORD_COLUMNS
from .store import FOLD_TURN, InboxItem, InvalidOutcome, RecordStore, StoreUnavailable, is_transient

__all__ = ["RecordStore", "StoreUnavailable", "InvalidOutcome", "InboxItem", "RECORD_COLUMNS"]
