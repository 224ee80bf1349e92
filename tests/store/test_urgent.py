"""pipeline/store/urgent.py: the write lock hands itself to urgent waiters first."""

import asyncio

from pipeline.store.urgent import UrgentFirstLock


async def test_an_urgent_write_goes_before_the_ordinary_ones_waiting():
    lock, order = UrgentFirstLock(), []

    async def write(name, urgent=False):
        async with (lock.urgent() if urgent else lock):
            order.append(name)
            await asyncio.sleep(0.01)

    first = asyncio.ensure_future(write("running"))
    await asyncio.sleep(0)
    queued = [asyncio.ensure_future(write(f"batch{i}")) for i in range(3)]
    await asyncio.sleep(0)
    row = asyncio.ensure_future(write("inbox", urgent=True))
    await asyncio.gather(first, *queued, row)
    assert order == ["running", "inbox", "batch0", "batch1", "batch2"]
    assert not lock.locked()


async def test_a_cancelled_waiter_neither_holds_nor_loses_the_lock():
    lock = UrgentFirstLock()
    await lock.acquire()
    gone = asyncio.ensure_future(lock.acquire(urgent=True))
    nxt = asyncio.ensure_future(lock.acquire())
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.sleep(0)
    lock.release()
    await asyncio.wait_for(nxt, 1)  # passed over the cancelled waiter
    assert lock.locked()
    lock.release()
    assert not lock.locked()


async def test_cancelled_after_the_hand_over_passes_the_lock_on():
    lock = UrgentFirstLock()
    await lock.acquire()
    a = asyncio.ensure_future(lock.acquire())
    b = asyncio.ensure_future(lock.acquire())
    await asyncio.sleep(0)
    lock.release()  # handed to a, which is cancelled before it runs
    a.cancel()
    await asyncio.wait_for(b, 1)
    assert lock.locked()
    lock.release()
    assert not lock.locked()
