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
