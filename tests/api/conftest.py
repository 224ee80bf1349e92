"""Fixtures for the API tests: the aiohttp app on 127.0.0.1 (aiohttp's
TestServer, a real socket) over the session's valkey-server and a SQLite file
in tmp_path, with one API key per scope set."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from config.settings import load_settings
from pipeline.api import make_app
from pipeline.api.auth import SCOPES, add_key

PARTITIONS = 4
TWILIO_TOKEN = "twilio-test-token"
VENDOR_SECRET = "vendor-test-secret"
BOOTSTRAP = "bootstrap-demo-key"


@dataclass
class Api:
    url: str
    http: aiohttp.ClientSession
    keys: dict[str, str]
    store_path: Path
    keys_path: Path
    redis_url: str
    app: Any

    def h(self, who: Optional[str]) -> dict[str, str]:
        """Headers for the key named ``who`` (None = no key)."""
        if who is None:
            return {}
        return {"Authorization": f"Bearer {self.keys.get(who, who)}"}

    async def call(self, method: str, path: str, who: Optional[str] = "all", **kw: Any) -> tuple[int, Any]:
        headers = {**self.h(who), **kw.pop("headers", {})}
        async with self.http.request(method, self.url + path, headers=headers, **kw) as resp:
            ctype = resp.headers.get("Content-Type", "")
            body = await resp.json() if "application/json" in ctype else await resp.text()
            return resp.status, body


def api_settings(tmp_path: Path):
    return dataclasses.replace(load_settings(env={}), partitions=PARTITIONS, data_dir=str(tmp_path / "data"),
                               db_path=str(tmp_path / "records.db"))


def make_keys(path: Path) -> dict[str, str]:
    keys = {}
    for name, scopes in {
        "all": list(SCOPES),
        "events": ["events:write"],
        "reader": ["records:read", "users:read"],
        "users": ["users:write"],
    }.items():
        # one producer's keys, each with its own scopes (producers' key spaces:
        # tests/security/test_producers.py)
        keys[name] = add_key(path, "test", scopes)[1]
    return keys


@pytest.fixture
def api_app_factory(redis_url, tmp_path):
    """``factory(**make_app_kwargs)`` → the app over this test's Redis and tmp files;
    ``factory.keys``: the plain keys by name (all, events, reader, users)."""
    settings = api_settings(tmp_path)
    keys_path = tmp_path / "api_keys.json"
    keys = make_keys(keys_path)

    def factory(**kw: Any):
        opts = dict(keys_path=str(keys_path), bootstrap_key=BOOTSTRAP, twilio_auth_token=TWILIO_TOKEN,
                    vendor_secret=VENDOR_SECRET, batch_max_events=50)
        opts.update(kw)
        return make_app(settings, broker_url=redis_url, store_path=settings.db_path, **opts)

    factory.keys = keys
    factory.settings = settings
    factory.keys_path = keys_path
    return factory


@pytest.fixture
async def api(api_app_factory, redis_url):
    app = api_app_factory()
    settings, keys, keys_path = api_app_factory.settings, api_app_factory.keys, api_app_factory.keys_path
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession() as http:
        yield Api(str(server.make_url("")).rstrip("/"), http, keys, Path(settings.db_path), keys_path,
                  redis_url, app)
    await server.close()
