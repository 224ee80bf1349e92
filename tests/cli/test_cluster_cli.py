"""Every `notify` command on a Redis Cluster of three masters (issue 29, items 1 and 2):
`notify run` with REDIS_URL naming one node, then each reading and repairing command
from another shell, which finds the broker in data/broker.url; several seed nodes in
one URL; a database other than 0 refused in one line. And the URL's ``prefix=``
honoured by every command (on the plain session server)."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.embedded import free_port
from pipeline.transport.keys import Keys
from tests.cli.test_cli import ROOT, notify
from tests.transport.cluster import Cluster
from tests.transport.helpers import produce_async

PASSWORD = "clu5ter-s3cret"
BAD_EVENT = b'{"biz_key": "bad", "category": "nope", "template": "otp", "recipients": ["c1"]}'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"), password=PASSWORD)
    try:
        yield c.start()
    finally:
        c.stop()


def one_line(p, code: int) -> str:
    err = p.stderr.strip()
    assert p.returncode == code and "Traceback" not in p.stderr and len(err.splitlines()) == 1 \
        and err.startswith("notify: "), (p.returncode, p.stdout[-2000:], p.stderr[-3000:])
    assert PASSWORD not in p.stderr + p.stdout
    return err


def base_env(tmp_path: Path) -> dict:
    env = dict(os.environ, NOTIFY_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=str(ROOT))
    for k in ("REDIS_URL", "NOTIFY_BROKER", "NOTIFY_DEBUG", "NOTIFY_PARTITIONS"):
        env.pop(k, None)
    (tmp_path / "notify.toml").write_text("receipt_poll_s = 0\n")
    env["NOTIFY_CONFIG"] = str(tmp_path / "notify.toml")
    return env


@pytest.mark.cluster
def test_every_command_on_a_cluster_of_three_masters(cluster, tmp_path):
    from pipeline.cli.demo import wait_ready

    cluster.flush()
    env = base_env(tmp_path)
    log = open(tmp_path / "run.log", "w")
    run = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", "--workers", "1", "--api-port", "0",
                            "--metrics-port", "0", "--providers", "fake"],
                           cwd=str(ROOT), env=dict(env, REDIS_URL=cluster.url), stdout=log, stderr=subprocess.STDOUT)
    remembered = tmp_path / "data" / "broker.url"
    try:
        deadline = time.time() + 30
        while not remembered.exists():
            assert run.poll() is None and time.time() < deadline, (tmp_path / "run.log").read_text()
            time.sleep(0.1)
        # the cluster URL given to `notify run` is remembered as the embedded server's is
        assert remembered.read_text() == cluster.url and stat.S_IMODE(remembered.stat().st_mode) == 0o600
        wait_ready(cluster.url)
        # every other command from here on: no REDIS_URL, the broker from data/broker.url
        user = json.loads(notify(env, "user", "set", "cu1", "--phone", "+15550001234", "--email", "c@example.com").stdout)
        assert user == {"user": "cu1", "preferences": ["email", "phone"], "devices": 0}
        sent = notify(env, "send", "--category", "otp", "--template", "otp", "--to", "cu1", "--param", "code=123456",
                      "--biz-key", "cl:1", "--wait", "30", timeout=60).stdout.strip().splitlines()
        assert json.loads(sent[0]) == {"accepted": "cl:1"}
        assert len(sent) == 2 and sent[1].split()[:3] in (["cu1", "sms", "ACCEPTED"], ["cu1", "sms", "DELIVERED"]), sent
        asyncio.run(produce_async(cluster.url, "notify.events", [(b"bad", BAD_EVENT)], partitions=8))

        tail = [json.loads(line) for line in notify(env, "outcomes", "tail").stdout.splitlines()]
        assert {o["biz_key"] for o in tail} == {"cl:1"} and {o["channel"] for o in tail} == {"sms"}
        first = notify(env, "outcomes", "tail", "--group", "bi").stdout.splitlines()
        assert len(first) == len(tail)
        assert notify(env, "outcomes", "tail", "--group", "bi").stdout == ""  # resumed where it stopped
        assert len(notify(env, "outcomes", "tail", "--from", str(time.time() - 600)).stdout.splitlines()) == len(tail)

        deadline = time.time() + 30
        while not (letters := notify(env, "dlq", "ls").stdout.splitlines()):
            assert time.time() < deadline, "no dead letter"
            time.sleep(0.3)
        assert [json.loads(d)["reason"] for d in letters] == ["unknown_category"]
        assert json.loads(notify(env, "dlq", "replay", "--source", "expand").stdout) == \
            {"replayed": {"notify.events": 1}, "not_replayed": {}}

        rebuilt = dict(env, NOTIFY_DB=str(tmp_path / "rebuilt" / "records.db"))
        replayed = json.loads(notify(rebuilt, "records", "replay").stdout)
        assert replayed["applied"] >= len(tail) and replayed["skipped"] == 0
        slo = json.loads(notify(env, "slo", "--json").stdout)
        assert slo["all"]["events"] == 1

        status = notify(env, "status").stdout
        assert "(Redis Cluster, 3 masters)" in status and "slots: 0→" in status and PASSWORD not in status
        # the dead letter, and the same event dead-lettered again once replayed (soon)
        assert any(line.split()[:1] == ["notify.dlq"] and line.split()[1] in ("1", "2") for line in status.splitlines()), \
            status
        # the OTP read by the priority process (the status shows its group's offsets on the
        # high topics), its delivery handed to that process's SMS lane in memory
        assert any(line.split() == ["notify.events.high", "1", "1", "0"] for line in status.splitlines()), status
        assert any(line.split() == ["notify.send.sms.high", "0", "0", "0"] for line in status.splitlines()), status
        assert any("/main-0 " in line and " up " in line for line in status.splitlines()), status

        # users=1: with seed 7 no address of a fake provider's failure scenarios (adapters/fake.py), no retries
        demo = notify(env, "demo", "--events", "6", "--users", "1", timeout=120).stdout
        assert "p99 ms" in demo and "ACCEPTED" in demo
    finally:
        run.terminate()
        code = run.wait(60)
    out = (tmp_path / "run.log").read_text()
    assert code == 0, out[-3000:]
    assert "(REDIS_URL; remembered in" in out and PASSWORD not in out
    assert not remembered.exists()  # its `notify run` is gone: "no broker" again
    assert "no broker" in one_line(notify(env, "status", check=False), 2)


def test_several_seed_nodes_in_one_url():
    from faust.utils.urls import urllist

    from pipeline.transport.client import BrokerURLError, parse_url, public_url, seed_nodes

    url = "redis://u:p%2Cw@h1:7000,h2:7001,[::1]:7002/0?prefix=x&slots=2"
    u = parse_url(url)
    assert seed_nodes(u) == [("h1", 7000), ("h2", 7001), ("::1", 7002)]
    assert (u.user, u.password, u.query["prefix"], u.query["slots"]) == ("u", "p,w", "x", "2")
    assert parse_url(urllist(url)) == u == parse_url(u)  # as Faust splits it, and again
    assert public_url(url) == "redis://u:***@h1:7000,h2:7001,[::1]:7002/0?prefix=x&slots=2"
    assert seed_nodes(parse_url("redis://h1/0")) == [("h1", 6379)]
    for bad, says in [("redis://:pw@h1:1,h2:2/3", "database 0 only, not 3"), ("redis://h1:1,h2:x/0", "'h2:x' does not parse"),
                      ("redis://h1:1,,h2:2/0", "'' is not host:port")]:
        with pytest.raises(BrokerURLError, match=says) as exc:
            parse_url(bad)
        assert "pw" not in str(exc.value)


@pytest.mark.cluster
def test_seed_nodes_and_a_database_other_than_0_on_a_cluster(cluster, tmp_path):
    cluster.flush()
    env = base_env(tmp_path)
    # the transport (through Faust, which splits the URL) and the CLI, the first seed down
    dead = free_port()
    seeds = cluster.seeds_url.replace("@", f"@127.0.0.1:{dead},", 1) + "?prefix=s"
    asyncio.run(produce_async(seeds, "notify.outcomes", [(b"u%d" % i, b'{"n": %d}' % i) for i in range(20)],
                              partitions=8))
    tail = notify(dict(env, REDIS_URL=seeds), "outcomes", "tail").stdout.splitlines()
    assert sorted(json.loads(line)["n"] for line in tail) == list(range(20))
    status = notify(dict(env, REDIS_URL=seeds), "status").stdout
    assert any(line.split()[:2] == ["notify.outcomes", "20"] for line in status.splitlines()), status
    assert f"@127.0.0.1:{dead},127.0.0.1:{cluster.nodes[0].port}," in status and "(Redis Cluster, 3 masters)" in status
    assert PASSWORD not in status
    time.sleep(0.01)
    since = str(time.time())  # what comes next, however soon the reader starts
    follow = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "outcomes", "tail", "-f", "--from", since, "-n", "2"],
                              cwd=str(ROOT), env=dict(env, REDIS_URL=seeds), stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)  # most likely following by now: polling the partitions
        asyncio.run(produce_async(seeds, "notify.outcomes", [(b"late1", b'{"n": 20}'), (b"late2", b'{"n": 21}')],
                                  partitions=8))
        out, _ = follow.communicate(timeout=30)
    finally:
        follow.kill()
    assert sorted(json.loads(line)["n"] for line in out.splitlines()) == [20, 21] and follow.returncode == 0
    one_node = cluster.url[:-2] + "/1"
    for url in (one_node, cluster.seeds_url[:-2] + "/1"):
        for cmd in (["status"], ["outcomes", "tail"], ["run", "--api-port", "0", "--metrics-port", "0"]):
            err = one_line(notify(dict(env, REDIS_URL=url), *cmd, check=False), 2)
            assert "a Redis Cluster has database 0 only, not 1" in err, err
    # seeds that are not a cluster, or none answering: one line too
    single = f"redis://127.0.0.1:{free_port()},127.0.0.1:{free_port()}/0"
    assert "cannot reach the Redis Cluster" in one_line(notify(dict(env, REDIS_URL=single), "status", check=False), 1)


def test_every_command_honours_the_url_prefix(redis_url, redis_sync, tmp_path):
    """`?prefix=` names the key namespace of the workers and the API; the CLI reads
    and writes there too, and never the default one."""
    url = redis_url + "?prefix=alt"
    env = dict(base_env(tmp_path), REDIS_URL=url, NOTIFY_PARTITIONS="4")
    outcome = b'{"biz_key": "p:1", "user_id": "u", "channel": "sms", "status": "FAILED"}'
    asyncio.run(produce_async(url, "notify.outcomes", [(b"u", outcome)], partitions=4))
    asyncio.run(produce_async(url, "notify.dlq", [(b"u", b'{"source": "expand", "reason": "r", "payload": "{}"}')],
                              partitions=4))
    alt, default = Keys("alt"), Keys()
    assert redis_sync.exists(alt.stream("notify.outcomes", 0)) + redis_sync.exists(alt.stream("notify.outcomes", 1)) \
        + redis_sync.exists(alt.stream("notify.outcomes", 2)) + redis_sync.exists(alt.stream("notify.outcomes", 3)) == 1
    assert notify(env, "outcomes", "tail").stdout.splitlines() == [outcome.decode()]
    assert notify(env, "outcomes", "tail", "--group", "g").stdout.splitlines() == [outcome.decode()]
    assert redis_sync.hgetall(alt.offsets("reader:g")) and not redis_sync.exists(default.offsets("reader:g"))
    assert [json.loads(d)["reason"] for d in notify(env, "dlq", "ls").stdout.splitlines()] == ["r"]
    assert json.loads(notify(env, "dlq", "replay").stdout)["replayed"] == {"notify.events": 1}
    assert sum(int(redis_sync.get(alt.counter("notify.events", p)) or 0) for p in range(4)) == 1
    redis_sync.set(alt.lease("notify", 0), b"w-alt")
    redis_sync.set(default.lease("notify", 0), b"w-default")
    status = notify(env, "status").stdout
    assert "slots: 0→w-alt" in status
    assert any(line.split()[:2] == ["notify.outcomes", "1"] for line in status.splitlines()), status
    replayed = json.loads(notify(env, "records", "replay").stdout)
    assert replayed["applied"] + replayed["skipped"] == 1
    assert not [k for k in redis_sync.keys("nfs:*") if k != default.lease("notify", 0).encode()]
