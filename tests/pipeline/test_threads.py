"""pipeline/threads.py: a main worker's record store writer keeps the ordinary
scheduling class while the rest of the worker runs at SCHED_IDLE (a holder of
SQLite's write lock, which the priority worker's writes share, is never starved)."""

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="Linux scheduling classes")

PROBE = textwrap.dedent("""
    import asyncio, os, sys, threading
    from pipeline import roles
    from pipeline.store import RecordStore

    async def probe():
        roles.lower_priority("main", 10, "idle")
        store = await RecordStore(sys.argv[1]).open()
        out = [os.sched_getscheduler(0), os.sched_getscheduler(store._db._thread.native_id),
               os.sched_getscheduler(store._ro._thread.native_id),
               os.getpriority(os.PRIO_PROCESS, store._db._thread.native_id)]
        await store.close()
        print(*out)

    asyncio.run(probe())
""")


def test_the_store_writer_of_a_lowered_worker_keeps_the_ordinary_class(tmp_path):
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    out = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path / "r.db")], capture_output=True, text=True,
                         timeout=60, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr
    loop, writer, reader, writer_nice = map(int, out.stdout.split())
    assert loop == os.SCHED_IDLE  # the event loop yields the core
    assert reader == os.SCHED_IDLE  # readers hold no lock anyone waits for
    assert writer == os.SCHED_OTHER  # the lock holder is never starved ...
    assert writer_nice == min(19, ours + 10)  # ... and still weighted below the priority worker
