"""The record store's merge, in Python and without I/O: how outcomes become
record rows (:func:`_row`: the values in ``schema._ROW_COLUMNS`` order, with
the ``state_key`` of the state's precedence rank and time, first-seen times),
how two rows of one record merge (:func:`_merge_rows`: the same order-free rules
as the SQL upsert, schema.py ``_UPSERT``), how a batch is folded to one row per
record and per device delivery (:func:`fold`, :func:`batch_rows`), and an
outcome's attempt row (:func:`_attempt_row`). pipeline/store/store.py writes
the result (:meth:`RecordStore.apply_outcomes`).
"""

from __future__ import annotations

from typing import Any

from .. import ids
from ..models import State
from ..rules.states import RANK, TERMINAL
from . import devices as devices_mod
from .schema import (
    _ACCEPTED, _CALLBACK, _CH, _CREATED, _DELIVERED, _DID, _IX, _LATENCY, _MKEY, _MSG, _PKEY, _PREFV, _PROV,
    _REASON, _RETRY, _SCHEDULED, _SENT, _SKEY, _STATUS, _TPLV, _UPDATED,
)  # fmt: skip

# state_key = rank * _K + microseconds: orders by rank, then by time (fits in int64
# until the year 2286)
_K = 10**16
_STATE_ACCEPTED = State.ACCEPTED
_STATE_DELIVERED = State.DELIVERED
_STATE_SCHEDULED = State.SCHEDULED


# ---------------------------------------------------------------------------
# outcome → row, and the same merge in Python (to fold a batch before SQL)


def _row(o: Any) -> list[Any]:
    state = o.state
    r = RANK[state]
    at = float(o.at)
    if not 0.0 <= at < 1e10:  # also NaN
        raise ValueError(f"outcome time out of range: {at!r}")
    key = r * _K + round(at * 1_000_000)
    provider = o.provider
    msg = o.provider_msg_id
    acc = o.accepted_at or None
    latency = None
    if state in TERMINAL:
        latency = o.latency_ms or (max(0.0, (at - acc) * 1000.0) if acc else None)
    return [
        o.delivery_id, o.notification_id, o.biz_key, o.user_id, o.channel, o.template,
        o.category, o.priority,
        state, o.reason, key,
        provider, key if provider is not None else None,
        msg, key if msg is not None else None,
        o.retry_count or 0, at, at,
        at if state == _STATE_ACCEPTED else None,
        at if state == _STATE_DELIVERED else None,
        acc, latency, o.producer or "", o.pref_version or None,
        at if state == _STATE_SCHEDULED else None,
        getattr(o, "template_version", 0) or None,
        1 if getattr(o, "callback", False) else 0,
    ]  # fmt: skip


def _merge_keyed(a: list[Any], b: list[Any], vi: int, ki: int) -> None:
    bk = b[ki]
    if bk is None:
        return
    ak = a[ki]
    if ak is None or bk > ak or (bk == ak and b[vi] > a[vi]):
        a[vi] = b[vi]
        a[ki] = bk


def _merge_rows(a: list[Any], b: list[Any]) -> None:
    """Merge row ``b`` into row ``a`` in place: the SQL upsert's rules, in Python."""
    if b[_SKEY] > a[_SKEY] or (b[_SKEY] == a[_SKEY] and (b[_REASON] or "") > (a[_REASON] or "")):
        a[_STATUS] = b[_STATUS]
        a[_REASON] = b[_REASON]
        a[_SKEY] = b[_SKEY]
    _merge_keyed(a, b, _PROV, _PKEY)
    _merge_keyed(a, b, _MSG, _MKEY)
    if b[_RETRY] > a[_RETRY]:
        a[_RETRY] = b[_RETRY]
    if b[_CREATED] < a[_CREATED]:
        a[_CREATED] = b[_CREATED]
    if b[_UPDATED] > a[_UPDATED]:
        a[_UPDATED] = b[_UPDATED]
    for i in (_SENT, _DELIVERED, _ACCEPTED, _LATENCY, _SCHEDULED):  # the least that is not None
        bi = b[i]
        if bi is not None:
            ai = a[i]
            if ai is None or bi < ai:
                a[i] = bi
    for i in (_PREFV, _TPLV):
        if b[i] is not None and (a[i] is None or b[i] > a[i]):
            a[i] = b[i]
    if b[_CALLBACK] > a[_CALLBACK]:
        a[_CALLBACK] = b[_CALLBACK]


def _attempt_row(o: Any, a: Any) -> tuple[Any, ...]:
    if isinstance(a, dict):  # an Outcome built from raw JSON without coercion
        get = a.get
        seq, channel, provider, started_at, result = (
            get("seq"), get("channel"), get("provider"), get("started_at", 0.0), get("result"))
        next_at, latency_ms, retry_after, msg, error, did = (
            get("next_at"), get("latency_ms"), get("retry_after"), get("provider_msg_id"), get("error"),
            get("delivery_id"))
    else:  # an Attempt record: its fields (None where one is missing)
        seq, channel, provider, started_at, result = (
            getattr(a, "seq", None), getattr(a, "channel", None), getattr(a, "provider", None),
            getattr(a, "started_at", 0.0), getattr(a, "result", None))
        next_at, latency_ms, retry_after, msg, error, did = (
            getattr(a, "next_at", None), getattr(a, "latency_ms", None), getattr(a, "retry_after", None),
            getattr(a, "provider_msg_id", None), getattr(a, "error", None), getattr(a, "delivery_id", None))
    if not isinstance(result, str) or not result:
        raise ValueError(f"attempt without a result: {a!r}")
    return (
        o.notification_id,
        int(seq),
        channel or o.channel,
        provider or o.provider or "",
        float(started_at),
        result,
        next_at,
        latency_ms,
        retry_after,
        msg,
        error,
        did or o.delivery_id,
    )


# ---------------------------------------------------------------------------
# a batch


def fold(
    o: Any, folded: dict[str, list[Any]], devices: dict[str, list[Any]], attempts: list[tuple[Any, ...]]
) -> bool:
    """Fold outcome ``o`` into a batch's rows: ``folded`` (record's delivery id → its
    row), ``devices`` (device delivery id → [record id, devices, row]) and ``attempts``.
    False (nothing folded) for an outcome the store cannot take."""
    try:
        row = _row(o)
        a = o.attempt
        if a is not None:
            attempts.append(_attempt_row(o, a))
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
        return False
    rid = ids.record_id(row[_DID])
    if rid != row[_DID]:  # a push to one device: its delivery, then its record
        dev = devices.get(row[_DID])
        if dev is None:
            devices[row[_DID]] = [rid, getattr(o, "devices", 0) or 0, list(row)]
        else:
            dev[1] = max(dev[1], getattr(o, "devices", 0) or 0)
            _merge_rows(dev[2], row)
        row[_DID] = rid
    prev = folded.get(row[_DID])
    if prev is None:
        folded[row[_DID]] = row
    else:
        _merge_rows(prev, row)
    return True


def batch_rows(
    folded: dict[str, list[Any]], devices: dict[str, list[Any]]
) -> tuple[list[list[Any]], list[tuple], list[str]]:
    """A folded batch's record rows, device delivery rows, and push records (whose
    state is derived again from their device deliveries)."""
    rows = list(folded.values())
    device_rows = [devices_mod.row(rid, did, n, r, _IX) for did, (rid, n, r) in devices.items()]
    push = [r[_DID] for r in rows if r[_CH] == "push"]
    return rows, device_rows, push
