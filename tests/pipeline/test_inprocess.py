"""The app factory and the in-process harness (pipeline/app.py, agents/__init__.py,
pipeline/testing.py): the pipeline's agents run in the test's own event loop on a
real broker and a real SQLite file, no worker process; and nothing is wired when
the modules are imported."""

import importlib
import subprocess
import sys

import pytest

from config.settings import load_settings
from pipeline.testing import running, send_event, wait_records
from tests.transport.helpers import ROOT


def _event(biz, user, channels=("inbox",)):
    return {"biz_key": biz, "category": "transaction", "template": "order_shipped", "recipients": [user],
            "channels": list(channels), "params": {"order_no": "1", "carrier": "UPS", "tracking_no": "1Z",
                                                   "tracking_url": "https://t.example/x"}}


@pytest.fixture
def settings(redis_url, tmp_path):
    return load_settings(env={"REDIS_URL": redis_url, "NOTIFY_DATA_DIR": str(tmp_path), "NOTIFY_PROVIDERS": "fake",
                              "NOTIFY_PARTITIONS": "2"})


async def test_an_event_runs_through_expand_guard_and_a_lane_in_process(settings):
    async with running(settings) as app:
        await send_event(app, _event("b1", "u1", ("inbox", "sms")))
        rows = await wait_records(app, "b1", n=2)
        assert sorted((r["channel"], r["status"]) for r in rows) == [("inbox", "DELIVERED"), ("sms", "FILTERED")]
        # the guard's dedup, through a part called directly: the same business key again
        await send_event(app, _event("b1", "u1", ("inbox",)))
        await wait_records(app, "b1", n=2)
    # stopped: the record store is closed for good (a worker's process can exit)
    assert app.resources.closed and app.resources._store is None


async def test_a_role_registers_its_agents_only(settings):
    from agents import register_agents
    from pipeline.app import create_app

    prio = create_app(settings, "priority")
    register_agents(prio)
    assert "guard.high" in prio.agents and "guard.low" not in prio.agents and "scheduler" not in prio.agents
    main = create_app(settings, "main")
    register_agents(main)
    assert "guard.high" not in main.agents and "guard.low" in main.agents and "scheduler" in main.agents
    with pytest.raises(RuntimeError):
        register_agents(main)


def test_importing_the_modules_wires_nothing():
    """No app, no settings read, no environment consulted at import (a bad
    NOTIFY_ROLE is an error of the factory, not of an import)."""
    code = ("import agents, agents.guard, agents.lanes, agents.scheduler, tables, pipeline.app, pipeline.roles;"
            "import faust; print(len([a for a in vars(pipeline.app).values() if isinstance(a, faust.App)]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         env={"NOTIFY_ROLE": "nonsense", "PATH": "/usr/bin:/bin"}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0"
    importlib.import_module("agents")


async def test_one_dedup_entry_per_intent_and_entries_of_before_still_count(settings, redis_url):
    """The guard writes one dedup changelog entry for all the channels of an intent
    (agents/guard.py), a repeat is a duplicate on each channel, and a per-channel
    entry of a table written before still makes its channel a duplicate."""
    import asyncio
    import time

    import redis as redis_sync

    from pipeline.transport.groups import entry_changes

    from pipeline.models import Preferences
    from pipeline.rules.plan import dedup_entry_key, dedup_key
    from tables import put

    async with running(settings) as app:
        await app.declared.preferences.send(key="d1", value=Preferences(user_id="d1", version=1,
                                                                          email="d1@example.com"))
        deadline = time.monotonic() + 10
        while app.user_tables.preferences.get("d1") is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await send_event(app, _event("dd1", "d1", ("inbox", "email")))
        rows = await wait_records(app, "dd1", n=2)
        assert sorted((r["channel"], r["status"]) for r in rows) == [("email", "ACCEPTED"), ("inbox", "DELIVERED")]
        entry = app.user_tables.dedup.get(dedup_entry_key("d1", "dd1"))
        assert entry is not None and set(entry[3]) == {"email", "inbox"} and entry[2] == "transaction"
        # a repeat: a duplicate on both channels, nothing written
        await send_event(app, _event("dd1", "d1", ("inbox", "email")))
        # a per-channel entry as a table of before holds it: its channel is a duplicate
        partition = app.transport.partition_for(app.declared.intents["normal"].get_topic_name(), b"d1")
        await put(app.user_tables.dedup, partition, dedup_key("d1", "dd2", "inbox"), [time.time(), "old", "transaction"])
        await send_event(app, _event("dd2", "d1", ("inbox", "email")))
        rows = await wait_records(app, "dd2", n=1)
        await asyncio.sleep(1.0)
        rows, _c = await (await app.resources.store()).find(biz_key="dd2", limit=10)
        assert [(r["channel"], r["status"]) for r in rows] == [("email", "ACCEPTED")]
        await app.producer.flush()

    r = redis_sync.Redis.from_url(redis_url)
    try:
        keys = [k for p in range(2) for _i, f in r.xrange(f"nfs:{{notify-dedup-changelog|{p}}}:s")
                for k, _v in entry_changes(f)]  # changes: an entry's, or those a group entry lists
    finally:
        r.close()
    d1 = sorted(k for k in keys if isinstance(k, str) and k.startswith("d1|"))
    # dd1 once (the repeat wrote nothing), dd2's per-channel entry of before, dd2's own entry
    assert len(d1) == 3, d1
    # the daily counter beside them, in the same table (agents/guard.py): dd1 and dd2 counted
    assert [k for k in keys if isinstance(k, tuple) and k[0] == "daily" and ":d1:" in k[1]]


async def test_daily_counters_live_beside_the_dedup_entries_and_those_of_before_still_count(settings):
    """The guard's daily counter is a key of the dedup table (agents/guard.py: a
    user's guard state changes as one changelog entry); a counter of the ``daily``
    table written before still counts until it expires."""
    import time

    from pipeline.rules.guard import counter_key, day_key
    from tables import put

    async with running(settings) as app:
        tb = app.user_tables
        partition = app.transport.partition_for(app.declared.intents["normal"].get_topic_name(), b"c1")
        key = counter_key("c1", "transaction", day_key(None, time.time()))
        await put(tb.daily, partition, key, 20)  # the category's limit, reached before this version
        await send_event(app, _event("cap1", "c1"))
        [row] = await wait_records(app, "cap1", n=1)
        assert (row["status"], row["reason"]) == ("FILTERED", "over_limit")
        key2 = counter_key("c2", "transaction", day_key(None, time.time()))
        await send_event(app, _event("cap2", "c2"))
        await wait_records(app, "cap2", n=1)
        assert tb.dedup.data.get(("daily", key2)) == 1 and key2 not in tb.daily.data


async def test_an_otp_just_after_its_users_phone_number_waits_for_the_update(settings, redis_url):
    """The guard's read barrier (agents/applied.py): a user's update written before
    an event, not yet applied when the event is planned (here: behind 20,000 other
    profiles on notify.preferences), is waited for and the event planned again,
    instead of ending FILTERED ``unreachable``; and a wait that times out (a backlog)
    plans as the table stands and does not wait again for a while."""
    import orjson

    from pipeline.cli.send import send_raw
    from pipeline.topics import PREFERENCES

    def profiles(prefix: str, last: str, n: int = 20_000) -> list:
        users = [f"{prefix}{i}" for i in range(n - 1)] + [last]
        return [(u.encode(), orjson.dumps({"user_id": u, "version": 1, "phone": f"+1555{i:07d}"}))
                for i, u in enumerate(users)]

    def otp(biz: str, user: str) -> dict:
        return {"biz_key": biz, "category": "otp", "template": "otp", "channels": ["sms"], "recipients": [user],
                "params": {"code": "123456"}}

    async with running(settings) as app:
        applied = app.parts.applied
        applied.timeout_s = 60.0
        await send_raw(redis_url, PREFERENCES, profiles("b", "ph1"))
        await send_event(app, otp("otp-ph1", "ph1"), high=True)
        rows = await wait_records(app, "otp-ph1", timeout=60)
        assert [(r["channel"], r["status"]) for r in rows] == [("sms", "ACCEPTED")], rows
        assert applied.waits == 1
        # behind a backlog that outlasts the wait: planned as the table stands (the number is
        # not there yet), and the next event of the partition does not wait at all
        applied.timeout_s = 0.05
        await send_raw(redis_url, PREFERENCES, profiles("c", "ph2"))
        await send_event(app, otp("otp-ph2-1", "ph2"), high=True)
        rows = await wait_records(app, "otp-ph2-1", timeout=60)
        assert [(r["channel"], r["status"], r["reason"]) for r in rows] == [("sms", "FILTERED", "unreachable")]
        await send_event(app, otp("otp-ph2-2", "ph2"), high=True)
        await wait_records(app, "otp-ph2-2", timeout=60)
        assert applied.waits == 2
        # a malformed update (dead-lettered by its topic, never seen by the agent) counts as
        # handled: it does not hold the barrier until its timeout
        applied.timeout_s = 60.0
        partition = app.transport.partition_for(PREFERENCES, b"ph3")
        applied._lagging.clear()
        await send_raw(redis_url, PREFERENCES, [(b"ph3", b"{not json")])
        await send_event(app, otp("otp-ph3", "ph3"), high=True)
        rows = await wait_records(app, "otp-ph3", timeout=10)
        assert [(r["channel"], r["status"], r["reason"]) for r in rows] == [("sms", "FILTERED", "unreachable")]
        assert partition not in applied._lagging


async def test_an_intent_read_again_the_other_way_is_planned_as_itself(settings):
    """An intent planned by expand where the event was read, then read again through
    notify.intents.<priority> (another worker's expand, replaying the event while
    this worker took the user's partition over): the same origin, so the guard takes
    it for itself (planned again, not counted), not for a duplicate left unsent."""
    import asyncio

    from pipeline import metrics
    from pipeline.models import Intent
    from pipeline.rules.plan import dedup_entry_key

    duplicates = metrics.outcomes.labels("FILTERED", "duplicate")
    async with running(settings) as app:
        tb = app.user_tables
        await send_event(app, _event("org1", "o1"))
        [row] = await wait_records(app, "org1", n=1)
        assert row["status"] == "DELIVERED"
        first = tb.dedup.data.get(dedup_entry_key("o1", "org1", ""))
        origin = first[1]
        assert origin.startswith("notify.events:") and origin.endswith(":0")
        daily = {k: v for k, v in tb.dedup.data.items() if isinstance(k, tuple) and k[0] == "daily"}
        before = duplicates.value
        ev = _event("org1", "o1")
        await app.declared.intents["normal"].send(key="o1", value=Intent(
            notification_id=row["notification_id"], biz_key="org1", user_id="o1", category="transaction",
            template="order_shipped", template_version=1, priority="normal", params=ev["params"],
            channels=ev["channels"], accepted_at=first[0], origin=origin))
        for _ in range(200):  # planned again: its entry's time moves on
            if tb.dedup.data.get(dedup_entry_key("o1", "org1", ""))[0] != first[0] or duplicates.value > before:
                break
            await asyncio.sleep(0.05)
        assert duplicates.value == before
        assert tb.dedup.data.get(dedup_entry_key("o1", "org1", ""))[1] == origin
        assert {k: v for k, v in tb.dedup.data.items() if isinstance(k, tuple) and k[0] == "daily"} == daily


async def test_a_plan_whose_barrier_awaited_is_made_again_on_the_tables_as_they_are(settings):
    """The guard's read barrier awaits the broker (seconds, while a master fails over).
    Meanwhile the same intent can be planned by another path (a rebalance gives the
    user's partition to a worker that replays the event, and back; or the intent
    topic's copy): its dedup entry and its count are there when the barrier returns.
    The intent is then planned again as itself, not counted a second time against
    the daily limit (the cluster failover drill: a user's next intent FILTERED
    over_limit)."""
    import time

    from pipeline.rules.guard import counter_key, day_key

    async with running(settings) as app:
        guard, applied, tb = app.parts.guard, app.parts.applied, app.user_tables
        plan_and_send, calls = guard.plan_and_send, []

        async def recorded(intent, partition, token):
            calls.append((intent, partition, token))
            await plan_and_send(intent, partition, token)

        async def wait(partition, since, timeout=None):
            if len(calls) == 1:  # the first plan awaits: the other path plans the same intent
                calls.append("other path")
                await plan_and_send(*calls[0])
            return False  # nothing pending, as after a broker that did not answer in time

        guard.plan_and_send, applied.wait = recorded, wait
        # no phone: sms is turned down for want of an address, so the plan goes through the barrier
        await send_event(app, _event("w1", "nophone", ("inbox", "sms")))
        rows = await wait_records(app, "w1", n=2)
        assert sorted((r["channel"], r["status"]) for r in rows) == [("inbox", "DELIVERED"), ("sms", "FILTERED")]
        assert tb.dedup.data.get(("daily", counter_key("nophone", "transaction", day_key(None, time.time())))) == 1
