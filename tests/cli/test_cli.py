"""Every `notify` command as a subprocess against a real embedded server."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def notify(env, *args, timeout=60, check=True):
    p = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], cwd=str(ROOT), env=env,
                       capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"notify {' '.join(args)} → {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture
def running(tmp_path):
    env = dict(os.environ, NOTIFY_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=str(ROOT))
    env.pop("REDIS_URL", None)
    (tmp_path / "notify.toml").write_text("receipt_poll_s = 0\n")
    env["NOTIFY_CONFIG"] = str(tmp_path / "notify.toml")
    log = open(tmp_path / "run.log", "w")
    run = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", "--api-port", "0", "--metrics-port", "0", "--providers", "fake"],
                           cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 30
    while not (tmp_path / "data" / "broker.url").exists() and time.time() < deadline:
        time.sleep(0.1)
    yield env
    run.terminate()
    assert run.wait(60) == 0, (tmp_path / "run.log").read_text()[-3000:]


def test_commands_against_the_embedded_server(running):
    env = running
    out = notify(env, "send", "--category", "transaction", "--template", "order_shipped", "--to", "c1",
                 "--param", "order_no=1", "--param", "carrier=UPS", "--param", "tracking_no=T",
                 "--param", "tracking_url=https://t", "--biz-key", "cli:1")
    assert json.loads(out.stdout) == {"accepted": "cli:1"}
    # refused at the door as the API refuses it: one line, exit 2, nothing written
    bad = notify(env, "send", "--json", '{"biz_key": "bad", "category": "nope", "template": "otp", "recipients": ["c1"]}',
                 check=False)
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "notify: invalid event: unknown_category: unknown_category: category (nope)"]
    missing = notify(env, "send", "--category", "transaction", "--template", "order_shipped", "--to", "c1",
                     "--param", "order_no=1", check=False)
    assert missing.returncode == 2 and "missing_params" in missing.stderr and "carrier" in missing.stderr
    # a producer writing to the stream directly is checked by expand: dead-lettered
    import asyncio as _asyncio

    from tests.transport.helpers import produce_async as _produce

    _broker = (Path(env["NOTIFY_DATA_DIR"]) / "broker.url").read_text().strip()
    _asyncio.run(_produce(_broker, "notify.events", [(b"bad", b'{"biz_key": "bad", "category": "nope", '
                                                              b'"template": "otp", "recipients": ["c1"]}')],
                          partitions=8))
    deadline = time.time() + 60
    while True:
        p = notify(env, "records", "show", "cli:1", check=False)
        if p.returncode == 0 and "DELIVERED" in p.stdout:
            break
        assert time.time() < deadline, p.stderr
        time.sleep(0.5)
    rows = json.loads(p.stdout)
    assert {r["channel"]: r["status"] for r in rows} == {"inbox": "DELIVERED", "push": "FILTERED"}
    # the records written again from the outcome stream, into a new store: the same rows
    # (and an entry on the stream that is not an outcome is skipped)
    import asyncio

    from tests.transport.helpers import produce_async

    broker = (Path(env["NOTIFY_DATA_DIR"]) / "broker.url").read_text().strip()
    asyncio.run(produce_async(broker, "notify.outcomes", [(b"c1", b"{not an outcome")], partitions=8))
    rebuilt = dict(env, NOTIFY_DB=str(Path(env["NOTIFY_DATA_DIR"]).parent / "rebuilt" / "records.db"))
    replayed = json.loads(notify(rebuilt, "records", "replay").stdout)
    assert replayed["applied"] >= 2 and replayed["skipped"] == 1
    again = json.loads(notify(rebuilt, "records", "show", "cli:1").stdout)
    assert {r["channel"]: (r["status"], r["reason"]) for r in again} == \
        {r["channel"]: (r["status"], r["reason"]) for r in rows}
    tail = notify(env, "outcomes", "tail", "-n", "50").stdout.splitlines()
    assert any(json.loads(line)["biz_key"] == "cli:1" for line in tail)
    # the plan's outcomes of cli:1 (inbox PENDING, push FILTERED) are one entry of the stream,
    import redis

    r = redis.Redis.from_url(broker)
    try:
        entries = [f[b"v"] for p in range(8) for _id, f in r.xrange(f"nfs:{{notify.outcomes|{p}}}:s")
                   if b'"cli:1"' in f[b"v"]]
    finally:
        r.close()
    # and the inbox lane's ACCEPTED and DELIVERED one more: five state changes, two entries.
    # The stream is at least once (docs/SCHEMA.md): the event sent while the workers were
    # still starting may be handled again after a rebalance moved its partition before its
    # offset was committed, and publishes the same entry again; each distinct entry counts once
    groups = [sorted((o["channel"], o["state"]) for o in json.loads(v)) for v in entries]
    assert list(dict.fromkeys(map(tuple, groups))) == \
        [(("inbox", "PENDING"), ("push", "FILTERED")), (("inbox", "ACCEPTED"), ("inbox", "DELIVERED"))], entries
    dlq = [json.loads(line) for line in notify(env, "dlq", "ls").stdout.splitlines()]
    # one bad entry (a letter written again by such a replay names the same place)
    assert dlq and {(d["source"], d["partition"], d["offset"], d["reason"]) for d in dlq} == \
        {(d["source"], d["partition"], d["offset"], "unknown_category") for d in dlq[:1]}, dlq
    assert "replayed" in notify(env, "dlq", "replay", "--source", "expand").stdout
    status = notify(env, "status").stdout
    assert "notify.events" in status and "slots: 0→" in status
    # the scaling signal: workers each priority needs for its goal (docs/SCALING.md)
    scaling = [line.split() for line in status.splitlines() if line.startswith(("high ", "normal ", "low "))]
    assert [row[0] for row in scaling] == ["high", "normal", "low"] and all(int(row[-1]) >= 1 for row in scaling)
    demo = notify(env, "demo", "--events", "40", "--users", "60", timeout=180).stdout
    assert "state" in demo and "p99 ms" in demo and "ACCEPTED" in demo
    assert "events have no record" not in demo, demo


def test_errors_are_one_clear_line_and_non_zero(tmp_path):
    env = dict(os.environ, NOTIFY_DATA_DIR=str(tmp_path / "empty"), PYTHONPATH=str(ROOT))
    env.pop("REDIS_URL", None)
    p = notify(env, "status", check=False)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "no broker" in p.stderr
    p = notify(env, "send", "--category", "otp", check=False)
    assert p.returncode == 2 and "send needs" in p.stderr
    p = notify(dict(env, REDIS_URL="redis://127.0.0.1:1/0"), "records", "show", "x", check=False)
    assert p.returncode != 0 and p.stderr.strip().count("\n") == 0


def test_the_first_send_arrives_and_says_how(running):
    """README's first commands: register a phone, send an OTP, see its final state
    (issue 24, item 8); bad contact data is refused at the door."""
    env = running
    from pipeline.cli.demo import wait_ready

    wait_ready((Path(env["NOTIFY_DATA_DIR"]) / "broker.url").read_text().strip())  # as a user waits for notify run
    out = json.loads(notify(env, "user", "set", "first1", "--phone", "+15550001234", "--email", "f@example.com").stdout)
    assert out == {"user": "first1", "preferences": ["email", "phone"], "devices": 0}
    p = notify(env, "send", "--category", "otp", "--template", "otp", "--to", "first1", "--param", "code=123456",
               "--wait", "60", timeout=90)
    lines = p.stdout.strip().splitlines()
    assert json.loads(lines[0])["accepted"].startswith("cli:")
    assert len(lines) == 2 and lines[1].startswith("first1 sms ") and " ms" in lines[1], p.stdout
    assert lines[1].split()[2] in ("ACCEPTED", "DELIVERED"), p.stdout
    bad = notify(env, "user", "set", "first2", "--phone", "call me", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith("notify: invalid user data: bad_value")
