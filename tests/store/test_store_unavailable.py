"""pipeline.store under storage failures: StoreUnavailable, and never half a batch."""

import asyncio
import contextlib
import os
import sqlite3
import stat

import pytest

from pipeline import ids
from pipeline.models import State
from pipeline.store import InboxItem, RecordStore, StoreUnavailable, is_transient

from .factory import dump, outcome


def first_batch():
    return [outcome(State.PENDING, 1.0, user_id=f"u{i}") for i in range(50)]


def second_batch(new=3000):
    """Updates of existing records first (a partial apply would show), then new records."""
    updates = [
        outcome(State.ACCEPTED, 2.0, user_id=f"u{i}", provider="a", provider_msg_id=f"m{i}", seq=1)
        for i in range(50)
    ]
    fresh = [
        outcome(State.ACCEPTED, 2.0, user_id=f"new{i}", provider="a", provider_msg_id=f"x{i}", seq=1,
                biz_key="campaign:" + "z" * 40)  # fmt: skip
        for i in range(new)
    ]
    return updates + fresh


async def assert_applied(store, batch):
    for o in batch[:: max(1, len(batch) // 20)]:
        [row] = await store.get(o.delivery_id)
        assert row["status"] == o.state


@pytest.fixture
async def store(tmp_path):
    s = await RecordStore(str(tmp_path / "r.db"), busy_timeout_ms=50).open()
    await s.apply_outcomes(first_batch())
    yield s
    await s.close()


async def test_read_only_database(store):
    await store._db.execute("PRAGMA query_only=1")  # what a read-only file looks like to SQLite
    before = dump(store.path)
    batch = second_batch(10)
    with pytest.raises(StoreUnavailable, match="readonly"):
        await store.apply_outcomes(batch)
    with pytest.raises(StoreUnavailable):
        await store.add_inbox([InboxItem("u1", "d1", "t", "b", 1.0)])
    with pytest.raises(StoreUnavailable):
        await store.mark_read("u1")
    assert dump(store.path) == before
    await store._db.execute("PRAGMA query_only=0")
    await store.apply_outcomes(batch)  # the same batch, later
    await assert_applied(store, batch)


def permissions_bind(tmp_path) -> bool:
    probe = tmp_path / "probe"
    probe.write_text("x")
    probe.chmod(stat.S_IRUSR)
    try:
        with open(probe, "a"):
            return False  # root with CAP_DAC_OVERRIDE
    except PermissionError:
        return True
    finally:
        probe.chmod(stat.S_IRUSR | stat.S_IWUSR)


async def test_read_only_file(tmp_path):
    if not permissions_bind(tmp_path):
        pytest.skip("file permissions do not bind this user (root); see the query_only test")
    path = str(tmp_path / "ro.db")
    async with RecordStore(path) as s:
        await s.apply_outcomes(first_batch())
    before = dump(path)
    os.chmod(path, stat.S_IRUSR | stat.S_IRGRP)
    try:
        s = await RecordStore(path, busy_timeout_ms=50).open()  # readable: the API can still query
        try:
            with pytest.raises(StoreUnavailable):
                await s.apply_outcomes(second_batch(10))
            assert len(await s.get(ids.notification_id("order_shipped:1", "u1"))) == 1
        finally:
            await s.close()
    finally:
        os.chmod(path, stat.S_IRUSR | stat.S_IWUSR)
    assert dump(path) == before


async def test_locked_database(store):
    other = sqlite3.connect(store.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # another writer holds the lock
        batch = second_batch(10)
        with pytest.raises(StoreUnavailable, match="locked"):
            await store.apply_outcomes(batch)
        other.execute("ROLLBACK")
        await store.apply_outcomes(batch)
        await assert_applied(store, batch)
    finally:
        other.close()


async def test_disk_full_mid_batch_rolls_back_everything(store):
    async with store._db.execute("PRAGMA page_count") as cur:
        pages = (await cur.fetchone())[0]
    await store._db.execute(f"PRAGMA max_page_count={pages + 5}")
    before = dump(store.path)
    batch = second_batch()
    with pytest.raises(StoreUnavailable, match="full"):
        await store.apply_outcomes(batch)
    assert dump(store.path) == before, "no partial batch"
    assert not store._db.in_transaction
    await store._db.execute("PRAGMA max_page_count=1073741823")
    await store.apply_outcomes(batch)
    await assert_applied(store, batch)
    async with store._db.execute("PRAGMA page_count") as cur:
        assert (await cur.fetchone())[0] > pages + 5, "the batch ran out of pages part-way through its rows"
    after = dump(store.path)
    assert len(after["notify_record"]) == 50 + 3000 and len(after["attempts"]) == 3050


async def test_other_errors_propagate_and_roll_back_too(store):
    await store._db.execute("DROP TABLE attempts")  # fails after the records were written
    before = await store.find(limit=1000)
    with pytest.raises(sqlite3.OperationalError, match="no such table") as err:
        await store.apply_outcomes(second_batch(10))
    assert not isinstance(err.value, StoreUnavailable)
    assert await store.find(limit=1000) == before


def test_transient_classification():
    assert is_transient(sqlite3.OperationalError("disk I/O error"))
    assert is_transient(sqlite3.OperationalError("database is locked"))
    assert is_transient(sqlite3.OperationalError("attempt to write a readonly database"))
    assert is_transient(sqlite3.OperationalError("database or disk is full"))
    coded = sqlite3.OperationalError("something the message does not say")
    coded.sqlite_errorcode = sqlite3.SQLITE_IOERR_WRITE
    assert is_transient(coded)
    assert not is_transient(sqlite3.OperationalError("no such table: attempts"))
    assert not is_transient(sqlite3.IntegrityError("UNIQUE constraint failed"))
    assert not is_transient(ValueError("disk I/O error"))


async def test_cancelled_mid_batch_leaves_all_or_nothing(store):
    batch = second_batch()
    task = asyncio.create_task(store.apply_outcomes(batch))
    for _ in range(3):
        await asyncio.sleep(0)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    n = len(dump(store.path)["notify_record"])
    assert n in (50, 3050), "the cancelled batch is applied whole or not at all"
    await store.apply_outcomes(batch)  # the connection is usable, no transaction left open
    assert len(dump(store.path)["notify_record"]) == 3050
