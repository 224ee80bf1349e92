"""pipeline/store/turn.py: the writers of one record store take turns at a lock
file (the kernel's queue) before SQLite's own lock, so a writer waits its turn
instead of polling SQLite until its busy timeout."""

import asyncio
import fcntl
import os
import subprocess
import sys
import textwrap
import time

import pytest

from pipeline.models import State
from pipeline.store import InboxItem, RecordStore
from pipeline.store.turn import WriteTurn

from .factory import outcome

HOLD = textwrap.dedent("""
    import fcntl, os, sys, time
    fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
""")


def _hold(path: str, seconds: float) -> subprocess.Popen:
    """Another process holding the turn for ``seconds``."""
    p = subprocess.Popen([sys.executable, "-c", HOLD, path, str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


@pytest.mark.asyncio
async def test_a_writer_waits_its_turn_past_the_busy_timeout_and_then_writes(tmp_path):
    path = str(tmp_path / "r.db")
    store = await RecordStore(path, busy_timeout_ms=100).open()
    try:
        holder = _hold(path + ".wlock", 0.6)  # longer than the busy timeout
        try:
            t0 = time.monotonic()
            await store.apply_outcomes([outcome(State.PENDING, 1.0)])  # no "database is locked"
            # it went after the other writer's turn: the turn was held ~0.6 s from before the
            # write began (the holder's exit, which gives it back, may be reaped a moment later)
            assert time.monotonic() - t0 >= 0.3
            assert holder.wait(timeout=10) == 0
        finally:
            holder.kill()
            holder.wait()
        rows = await store._read("SELECT status FROM notify_record")
        assert [r[0] for r in rows] == ["PENDING"]
        assert oct(os.stat(path + ".wlock").st_mode & 0o777) == "0o600"
    finally:
        await store.close()


def test_the_turn_is_given_back_and_taken_again_after_close(tmp_path):
    turn = WriteTurn(str(tmp_path / "r.db"))
    turn.take()
    fd = os.open(turn.path, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):  # held: another file of the same path is refused
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        turn.give()
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        turn.take()
        turn.close()  # the file closed: the kernel drops the lock with it
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        turn.take()  # opened again
        turn.give()
    finally:
        os.close(fd)
        turn.close()


@pytest.mark.asyncio
async def test_two_stores_on_one_file_write_in_turns(tmp_path):
    path = str(tmp_path / "r.db")
    a, b = await RecordStore(path).open(), await RecordStore(path).open()
    try:
        await asyncio.gather(*(s.add_inbox([InboxItem("u1", f"d{i}-{n}", "t", "b", 1.0) for n in range(20)])
                               for i, s in enumerate((a, b, a, b))))
        rows = await a._read("SELECT count(*) FROM inbox")
        assert rows[0][0] == 80
    finally:
        await a.close()
        await b.close()


@pytest.mark.asyncio
async def test_a_batch_whose_caller_is_cancelled_commits_whole_and_blocks_no_later_write(tmp_path):
    """A record batch is one job in the writer's thread (docs/adr/0007): cancelled while
    it waits for the turn, it still runs, whole; the process's write lock stays held
    until it ends, so a write started meanwhile queues behind it in this process (an
    urgent one still goes first of those waiting), and runs once it is done."""
    path = str(tmp_path / "r.db")
    store = await RecordStore(path).open()
    try:
        holder = _hold(path + ".wlock", 0.4)  # another process's turn: the batch's job waits in take()
        try:
            batch = asyncio.ensure_future(store.apply_outcomes(
                [outcome(State.PENDING, 1.0, biz_key=f"order_shipped:{n}") for n in range(50)]))
            await asyncio.sleep(0.1)
            batch.cancel()
            with pytest.raises(asyncio.CancelledError):
                await batch
            assert store._wlock.locked(), "the write lock is held until the cancelled batch's job ends"
            await asyncio.wait_for(store.add_click("d-x", 0, "https://example.com/", at=2.0), timeout=10)
        finally:
            holder.wait()
        rows = await store._read("SELECT count(*) FROM notify_record")
        assert rows[0][0] == 50, "the cancelled batch ran whole"
    finally:
        await store.close()
