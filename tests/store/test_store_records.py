"""pipeline.store: schema, merged records, attempts, queries — on real SQLite files."""

import asyncio
import random
import sqlite3
import tempfile
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from pipeline import ids
from pipeline.models import State
from pipeline.rules.states import RANK, TERMINAL, merge_all
from pipeline.store import RECORD_COLUMNS, InvalidOutcome, RecordStore

from .factory import SEED_000_COLUMNS, dump, outcome

SEED_000 = Path("/work/shared/seeds/000_a058439b35e43ae4.txt")


@pytest.fixture
async def store(tmp_path):
    s = await RecordStore(str(tmp_path / "records.db")).open()
    yield s
    await s.close()


async def columns(store, table):
    async with store._db.execute(f"PRAGMA table_info({table})") as cur:
        return [r[1] for r in await cur.fetchall()]


# -- schema ------------------------------------------------------------------


async def test_schema_follows_seed_000(store):
    cols = await columns(store, "notify_record")
    assert tuple(cols[: len(SEED_000_COLUMNS)]) == SEED_000_COLUMNS
    for extra in ("delivery_id", "notification_id", "category", "priority", "updated_at",
                  "delivered_at", "accepted_at", "latency_ms"):  # fmt: skip
        assert extra in cols
    assert RECORD_COLUMNS[: len(SEED_000_COLUMNS)] == SEED_000_COLUMNS
    if SEED_000.exists():  # the seed itself, when the shared folder is there
        ddl = SEED_000.read_text(encoding="utf-8")
        ddl = ddl[ddl.index("CREATE TABLE notify_record") : ddl.index("UNIQUE KEY")]
        named = [ln.split()[0] for ln in ddl.splitlines()[1:] if ln.strip()]
        named = [c.rstrip(",") for c in named] + ["sent_at"]  # "created_at …, sent_at …" share a line
        assert tuple(named) == SEED_000_COLUMNS


async def test_seed_001_attempts_columns_and_key(store):
    cols = await columns(store, "attempts")
    for c in ("notification_id", "seq", "channel", "started_at", "result", "next_at",
              "provider", "latency_ms", "retry_after", "provider_msg_id", "error", "delivery_id"):  # fmt: skip
        assert c in cols
    async with store._db.execute("PRAGMA index_list(attempts)") as cur:
        pk = [r for r in await cur.fetchall() if r[3] == "pk"]
    async with store._db.execute(f"PRAGMA index_info({pk[0][1]})") as cur:
        assert [r[2] for r in await cur.fetchall()] == ["delivery_id", "seq"]


async def test_wal_and_synchronous_normal(store):
    async with store._db.execute("PRAGMA journal_mode") as cur:
        assert (await cur.fetchone())[0] == "wal"
    async with store._db.execute("PRAGMA synchronous") as cur:
        assert (await cur.fetchone())[0] == 1  # NORMAL


async def test_unique_biz_user_channel(store):
    await store.apply_outcomes([outcome(State.PENDING, 1.0)])
    with pytest.raises(sqlite3.IntegrityError):
        await store._db.execute(
            "INSERT INTO notify_record (biz_key, user_id, channel, template_code, status,"
            " created_at, delivery_id, notification_id, updated_at, state_key)"
            " VALUES ('order_shipped:1', 'u1', 'sms', 't', 'PENDING', 1, 'other', 'n', 1, 0)"
        )
    # an outcome whose delivery_id contradicts its keys is refused, with nothing applied
    before = dump(store.path)
    good = outcome(State.ACCEPTED, 2.0, provider="a")
    bad = outcome(State.ACCEPTED, 2.0, delivery_id="n_bogus.sms")
    with pytest.raises(InvalidOutcome) as err:
        await store.apply_outcomes([good, bad])
    assert err.value.outcomes == [bad]
    assert dump(store.path) == before


async def test_unknown_state_refused_before_writing(store):
    with pytest.raises(InvalidOutcome) as err:
        await store.apply_outcomes([outcome(State.PENDING, 1.0), outcome("SENT", 2.0, user_id="u2")])
    assert [o.state for o in err.value.outcomes] == ["SENT"]
    assert dump(store.path)["notify_record"] == []


@pytest.mark.parametrize("at", [float("nan"), float("inf"), -1.0, 1e12])
async def test_bad_times_and_attempts_refused(store, at):
    good = outcome(State.PENDING, 1.0)
    with pytest.raises(InvalidOutcome) as err:
        await store.apply_outcomes([good, outcome(State.PENDING, at, user_id="u2")])
    assert len(err.value.outcomes) == 1
    broken = outcome(State.ACCEPTED, 1.0, user_id="u3", seq=1)
    broken.attempt.seq = None
    with pytest.raises(InvalidOutcome) as err:
        await store.apply_outcomes([good, broken])
    assert err.value.outcomes == [broken]
    no_result = outcome(State.ACCEPTED, 1.0, user_id="u4", seq=1)
    no_result.attempt.result = None
    with pytest.raises(InvalidOutcome):
        await store.apply_outcomes([no_result])
    assert dump(store.path)["notify_record"] == []


async def test_in_memory_store():
    async with RecordStore(":memory:") as s:
        await s.apply_outcomes([outcome(State.PENDING, 1.0), outcome(State.ACCEPTED, 2.0)])
        await s.add_inbox([{"user_id": "u1", "delivery_id": "d", "title": "t", "body": "b"}])
        [row] = await s.get(ids.notification_id("order_shipped:1", "u1"))
        assert row["status"] == State.ACCEPTED
        assert (await s.inbox("u1"))[1] == 1


async def test_reopen_keeps_data(tmp_path):
    path = str(tmp_path / "r.db")
    async with RecordStore(path) as s:
        await s.apply_outcomes([outcome(State.PENDING, 1.0)])
    async with RecordStore(path) as s:
        [row] = await s.get(ids.notification_id("order_shipped:1", "u1"))
        assert row["status"] == State.PENDING


# -- merging -----------------------------------------------------------------


async def test_a_delivery_history_out_of_order(store):
    did = ids.delivery_id("order_shipped:1", "u1", "sms")
    history = [
        outcome(State.PENDING, 10.0, accepted_at=9.5),
        outcome(State.UNKNOWN, 11.0, provider="a", seq=1, result="TIMEOUT_UNKNOWN", accepted_at=9.5),
        outcome(State.PENDING, 12.0, retry_count=1, reason="reconciled_not_found", accepted_at=9.5),
        outcome(State.ACCEPTED, 13.0, provider="b", provider_msg_id="m-1", retry_count=1,
                seq=2, accepted_at=9.5),  # fmt: skip
        outcome(State.DELIVERED, 20.0, accepted_at=9.5),  # a receipt without provider fields
    ]
    await store.apply_outcomes([history[4], history[2]])
    [row] = await store.get(did)
    assert row["status"] == State.DELIVERED and row["sent_at"] is None
    await store.apply_outcomes([history[3], history[0]])
    await store.apply_outcomes([history[1]])
    [row] = await store.get(did)
    assert row["status"] == State.DELIVERED
    assert (row["provider"], row["provider_msg_id"]) == ("b", "m-1")
    assert row["retry_count"] == 1
    assert (row["created_at"], row["updated_at"]) == (10.0, 20.0)
    assert (row["sent_at"], row["delivered_at"], row["accepted_at"]) == (13.0, 20.0, 9.5)
    assert row["latency_ms"] == pytest.approx(3500.0)  # to the first terminal outcome
    assert row["reason"] is None
    assert row["template_code"] == "order_shipped" and row["category"] == "order"
    assert [a["seq"] for a in await store.attempts(did)] == [1, 2]
    assert [r["delivery_id"] for r in await store.by_provider_msg_id("m-1")] == [did]
    assert await store.by_provider_msg_id("m-1", provider="a") == []


async def _push_to_two_devices(store):
    """A push record of u1 ACCEPTED on two devices (hms "r-a", apns "apns-b"): (record id, a, b)."""
    rec = ids.delivery_id("order_shipped:1", "u1", "push")
    a, b = ids.device_delivery_id(rec, "hms", "tok-a"), ids.device_delivery_id(rec, "apns", "tok-b")
    await store.apply_outcomes([
        outcome(State.ACCEPTED, 10.0, channel="push", delivery_id=a, devices=2, provider="hms", provider_msg_id="r-a"),
        outcome(State.ACCEPTED, 11.0, channel="push", delivery_id=b, devices=2, provider="apns",
                provider_msg_id="apns-b"),
    ])
    return rec, a, b


async def test_a_receipt_for_one_device_is_matched_to_that_devices_delivery(store):
    """A push provider's receipt (Huawei Push Kit's) names the message sent to one
    device: by_provider_msg_id gives that device's delivery (its delivery_id, its
    state), with its record's fields, and not the record besides; an outcome for it
    makes the record DELIVERED (derived from its devices')."""
    rec, a, b = await _push_to_two_devices(store)
    [row] = await store.by_provider_msg_id("r-a")
    assert (row["delivery_id"], row["status"], row["provider"], row["provider_msg_id"]) == (a, "ACCEPTED", "hms",
                                                                                          "r-a")
    assert (row["biz_key"], row["user_id"], row["channel"], row["template_code"]) == (
        "order_shipped:1", "u1", "push", "order_shipped")
    assert await store.by_provider_msg_id("r-a", provider="apns") == []
    # the record carries the highest device outcome's id: still one row, the device's
    [rec_row] = await store.get(rec)
    [row] = await store.by_provider_msg_id(rec_row["provider_msg_id"])
    assert row["delivery_id"] in (a, b)
    await store.apply_outcomes([outcome(State.DELIVERED, 12.0, channel="push", delivery_id=a, provider="hms",
                                        provider_msg_id="r-a")])
    [rec_row] = await store.get(rec)
    assert rec_row["status"] == State.DELIVERED
    assert {d["delivery_id"]: d["status"] for d in await store.deliveries(rec)} == {a: "DELIVERED", b: "ACCEPTED"}


async def test_many_message_ids_are_matched_in_one_read(store):
    """by_provider_msg_ids (a take of receipts) answers each id as a receipt of its
    own is matched: records, a push's device deliveries instead of their record,
    nothing for an unknown id, an id asked twice answered once."""
    rec, a, b = await _push_to_two_devices(store)
    await store.apply_outcomes([
        outcome(State.ACCEPTED, 12.0, channel="sms", user_id="u2", provider="twilio", provider_msg_id="SM1"),
        outcome(State.ACCEPTED, 13.0, channel="email", user_id="u3", provider="smtp", provider_msg_id="SM1"),
    ])
    [rec_row] = await store.get(rec)
    wanted = ["r-a", "apns-b", "SM1", "nope", rec_row["provider_msg_id"], "SM1"]
    many = await store.by_provider_msg_ids(wanted)
    dids = {mid: sorted(r["delivery_id"] for r in rows) for mid, rows in many.items()}
    assert dids["r-a"] == [a] and dids["apns-b"] == [b]
    assert dids["SM1"] == sorted([ids.delivery_id("order_shipped:1", "u2", "sms"),
                                  ids.delivery_id("order_shipped:1", "u3", "email")])
    # the record carries one device's message id: that device's delivery, not the record
    assert dids[rec_row["provider_msg_id"]] in ([a], [b])
    assert "nope" not in many and len(many["SM1"]) == 2


async def test_terminal_never_regresses_and_facts_beat_decisions(store):
    await store.apply_outcomes([outcome(State.FILTERED, 5.0, reason="opt_out")])
    await store.apply_outcomes([outcome(State.PENDING, 6.0), outcome(State.SCHEDULED, 7.0)])
    [row] = await store.get(ids.notification_id("order_shipped:1", "u1"))
    assert (row["status"], row["reason"]) == (State.FILTERED, "opt_out")
    # a duplicate that was in fact accepted: the record says what the provider did
    await store.apply_outcomes([outcome(State.ACCEPTED, 4.0, provider="a")])
    [row] = await store.get(ids.notification_id("order_shipped:1", "u1"))
    assert (row["status"], row["reason"], row["sent_at"]) == (State.ACCEPTED, None, 4.0)


async def test_attempts_inserted_once(store):
    did = ids.delivery_id("order_shipped:1", "u1", "sms")
    a1 = outcome(State.UNKNOWN, 1.0, seq=1, result="TIMEOUT_UNKNOWN", provider="a")
    a2 = outcome(State.ACCEPTED, 2.0, seq=2, provider="a")
    await store.apply_outcomes([a1, a1, a2])
    await store.apply_outcomes([a2, a1])
    rows = await store.attempts(did)
    assert [(a["seq"], a["result"]) for a in rows] == [(1, "TIMEOUT_UNKNOWN"), (2, "ACCEPTED")]
    assert rows[0]["notification_id"] == ids.notification_id("order_shipped:1", "u1")
    assert await store.attempt_counts() == [
        {"channel": "sms", "provider": "a", "result": "ACCEPTED", "count": 1},
        {"channel": "sms", "provider": "a", "result": "TIMEOUT_UNKNOWN", "count": 1},
    ]
    assert await store.attempt_counts(since=101.5) == [
        {"channel": "sms", "provider": "a", "result": "ACCEPTED", "count": 1}
    ]


# -- the order-free property ---------------------------------------------------

DELIVERIES = [("b1", "u1", "sms"), ("b1", "u1", "push"), ("b2", "u2", "email")]


@st.composite
def outcome_streams(draw):
    """Outcomes for a few deliveries with many ties; an attempt is the same whenever replayed."""
    n = draw(st.integers(1, 30))
    out = []
    for _ in range(n):
        biz, user, ch = draw(st.sampled_from(DELIVERIES))
        seq = draw(st.none() | st.integers(1, 3))
        out.append(
            outcome(
                draw(st.sampled_from(State.ALL)),
                draw(st.sampled_from([1.0, 2.0, 2.5, 3.0])),
                biz_key=biz,
                user_id=user,
                channel=ch,
                seq=seq,
                result=["ACCEPTED", "TIMEOUT_UNKNOWN", "RATE_LIMITED"][(seq or 1) - 1],
                reason=draw(st.sampled_from([None, "opt_out", "quiet_hours"])),
                provider=draw(st.sampled_from([None, "a", "b"])) if seq is None else "a",
                provider_msg_id=draw(st.sampled_from([None, "m1", "m2"])),
                retry_count=draw(st.integers(0, 3)),
                accepted_at=draw(st.sampled_from([0.0, 0.5])),
                latency_ms=draw(st.sampled_from([0.0, 40.0])),
                callback=draw(st.booleans()),
            )
        )
    return out


def model(outcomes):
    """What the records must be: each field a max/min over the set of outcomes seen."""

    def key(o):
        return (RANK[o.state], round(o.at * 1_000_000))

    def latency(o):
        if o.state not in TERMINAL:
            return None
        if o.latency_ms:
            return o.latency_ms
        return (o.at - o.accepted_at) * 1000 if o.accepted_at else None

    def least(values):
        values = [v for v in values if v is not None]
        return min(values) if values else None

    by = defaultdict(list)
    for o in outcomes:
        by[o.delivery_id].append(o)
    rows = {}
    for did, os_ in by.items():
        top = max(os_, key=lambda o: (key(o), o.reason or ""))
        assert top.state == merge_all(o.state for o in os_)
        with_p = [o for o in os_ if o.provider is not None]
        with_m = [o for o in os_ if o.provider_msg_id is not None]
        rows[did] = {
            "status": top.state,
            "reason": top.reason,
            "provider": max(with_p, key=lambda o: (key(o), o.provider)).provider if with_p else None,
            "provider_msg_id": (
                max(with_m, key=lambda o: (key(o), o.provider_msg_id)).provider_msg_id
                if with_m
                else None
            ),
            "retry_count": max(o.retry_count for o in os_),
            "created_at": min(o.at for o in os_),
            "updated_at": max(o.at for o in os_),
            "sent_at": least(o.at for o in os_ if o.state == State.ACCEPTED),
            "delivered_at": least(o.at for o in os_ if o.state == State.DELIVERED),
            "accepted_at": least(o.accepted_at or None for o in os_),
            "latency_ms": least(latency(o) for o in os_),
            "biz_key": os_[0].biz_key,
            "user_id": os_[0].user_id,
            "channel": os_[0].channel,
            "notification_id": os_[0].notification_id,
            # its producer hears of it (agents/callbacks.py): once any outcome said so
            "callback": int(any(o.callback for o in os_)),
        }
    return rows


def batches(rnd, items):
    out, i = [], 0
    while i < len(items):
        n = rnd.randint(1, 8)
        out.append(items[i : i + n])
        i += n
    return out


async def replay(path, outcome_batches):
    async with RecordStore(path) as s:
        for b in outcome_batches:
            await s.apply_outcomes(b)
        got = {}
        for did in {o.delivery_id for b in outcome_batches for o in b}:
            [row] = await s.get(did)
            [(row["callback"],)] = await s._read("SELECT callback FROM notify_record WHERE delivery_id = ?", (did,))
            got[did] = row
        attempts = {did: await s.attempts(did) for did in got}
    return got, attempts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(outcome_streams(), st.randoms(use_true_random=False))
def test_any_order_and_duplicates_give_the_model_rows(stream, rnd):
    expected = model(stream)
    shuffled = stream + rnd.sample(stream, k=rnd.randint(0, len(stream)))
    rnd.shuffle(shuffled)
    with tempfile.TemporaryDirectory() as tmp:
        got1, att1 = asyncio.run(replay(f"{tmp}/a.db", batches(rnd, stream)))
        # the same outcomes in another order, with duplicates, in other batches
        got2, att2 = asyncio.run(replay(f"{tmp}/b.db", batches(rnd, shuffled)))
        # and everything again on top of the first file: a replay changes nothing
        before = dump(f"{tmp}/a.db")
        got3, _ = asyncio.run(replay(f"{tmp}/a.db", batches(rnd, shuffled)))
        assert dump(f"{tmp}/a.db") == before

    for got in (got1, got2, got3):
        assert set(got) == set(expected)
        for did, row in got.items():
            assert {k: row[k] for k in expected[did]} == expected[did], did
    strip = lambda rows: {d: {k: v for k, v in r.items() if k != "id"} for d, r in rows.items()}  # noqa: E731
    assert strip(got1) == strip(got2)
    assert att1 == att2
    seqs = {(o.delivery_id, o.attempt.seq) for o in stream if o.attempt is not None}
    assert sorted((d, a["seq"]) for d, rows in att1.items() for a in rows) == sorted(seqs)


# -- queries -------------------------------------------------------------------


async def test_get_by_notification_or_delivery(store):
    await store.apply_outcomes(
        [outcome(State.PENDING, 1.0, channel=c) for c in ("sms", "push", "inbox")]
        + [outcome(State.PENDING, 1.0, user_id="u2")]
    )
    nid = ids.notification_id("order_shipped:1", "u1")
    assert [r["channel"] for r in await store.get(nid)] == ["inbox", "push", "sms"]
    [row] = await store.get(ids.delivery_id("order_shipped:1", "u1", "push"))
    assert row["channel"] == "push" and row["notification_id"] == nid
    assert await store.get("n_00000000000000000000") == []
    assert await store.get("n_00000000000000000000.sms") == []


async def test_find_paginates_by_id(store):
    rnd = random.Random(7)
    made = []
    for b in range(0, 150, 30):
        batch = [
            outcome(State.PENDING, float(i), biz_key=f"k{i % 4}", user_id=f"u{i % 3}", channel=f"c{i // 12}")
            for i in range(b, b + 30)
        ]
        rnd.shuffle(batch)
        made += batch
        await store.apply_outcomes(batch)

    async def walk(**filters):
        seen, cursor = [], None
        while True:
            rows, cursor = await store.find(limit=7, cursor=cursor, **filters)
            seen += rows
            if cursor is None:
                return seen

    for filters in ({}, {"user_id": "u1"}, {"biz_key": "k2"}, {"biz_key": "k2", "user_id": "u1"}):
        rows = await walk(**filters)
        ids_ = [r["id"] for r in rows]
        assert ids_ == sorted(set(ids_), reverse=True), "newest first, no repeats"
        want = [
            o for o in made
            if all(getattr(o, k) == v for k, v in filters.items())
        ]  # fmt: skip
        assert sorted(r["delivery_id"] for r in rows) == sorted(o.delivery_id for o in want)
    rows, cursor = await store.find(user_id="nobody")
    assert (rows, cursor) == ([], None)
    rows, cursor = await store.find(limit=150)
    assert len(rows) == 150 and cursor == rows[-1]["id"]
    assert await store.find(cursor=cursor) == ([], None)


async def test_counts_today(store):
    day = 86400.0 * 20000
    now = day + 3600 * 15
    await store.apply_outcomes(
        [
            outcome(State.ACCEPTED, day - 10, user_id="yesterday"),
            outcome(State.ACCEPTED, day + 10, user_id="a"),
            outcome(State.DELIVERED, day + 20, user_id="b"),
            outcome(State.FILTERED, day + 30, user_id="c", reason="opt_out"),
            outcome(State.FILTERED, day + 40, user_id="d", reason="opt_out"),
            outcome(State.FILTERED, day + 50, user_id="e", reason="quiet_hours"),
            outcome(State.FAILED, day + 60, user_id="f", reason="invalid_number"),
            outcome(State.PENDING, day + 70, user_id="g"),
        ]
    )
    counts = await store.counts_today(now)
    assert counts["since"] == day
    assert counts["total"] == 7
    assert counts["states"] == {
        State.PENDING: 1, State.FILTERED: 3, State.FAILED: 1, State.ACCEPTED: 1, State.DELIVERED: 1,
    }  # fmt: skip
    assert counts["reasons"] == {
        State.FILTERED: {"opt_out": 2, "quiet_hours": 1},
        State.FAILED: {"invalid_number": 1},
    }
    assert list(counts["states"]) == [State.PENDING, State.FILTERED, State.FAILED, State.ACCEPTED, State.DELIVERED]


async def test_a_store_made_before_the_callback_column_gets_it_without_a_rebuild(tmp_path):
    """A file whose notify_record has no ``callback`` column (made before it): opening
    it adds the column (ALTER TABLE, the rows and their ids kept), NULL in the rows
    written before: Callbacks.heard then looks their events up; the rows written
    after keep what their outcomes said."""
    path = str(tmp_path / "old.db")
    async with RecordStore(path) as s:
        await s.apply_outcomes([outcome("ACCEPTED", 1.0, user_id="u1", provider="a", provider_msg_id="SM1")])
    con = sqlite3.connect(path)
    con.execute("ALTER TABLE notify_record DROP COLUMN callback")
    con.commit()
    before = con.execute("SELECT id, delivery_id FROM notify_record").fetchall()
    con.close()
    async with RecordStore(path) as s:
        await s.apply_outcomes([outcome("ACCEPTED", 2.0, user_id="u2", provider="a", provider_msg_id="SM2",
                                        callback=True)])
        found = await s.by_provider_msg_ids(["SM1", "SM2"])
    assert [r["callback"] for r in found["SM1"]] == [None] and [r["callback"] for r in found["SM2"]] == [1]
    con = sqlite3.connect(path)
    assert con.execute("SELECT id, delivery_id FROM notify_record WHERE user_id = 'u1'").fetchall() == before
    con.close()

    from types import SimpleNamespace

    from agents.callbacks import Callbacks

    looked_up = []

    async def wanted_keys(keys):
        looked_up.append(keys)
        return set(keys)

    cb = SimpleNamespace(cfg=SimpleNamespace(enabled=True), wanted_keys=wanted_keys)
    rows = found["SM1"] + found["SM2"]
    assert await Callbacks.heard(cb, rows) == [True, True]
    assert looked_up == [[("", "order_shipped:1")]]  # the old row only
    cb.cfg.enabled = False
    assert await Callbacks.heard(cb, rows) == [False, False]
