"""The API fixtures of tests/api (a real aiohttp server on 127.0.0.1 over the
session's valkey-server and a SQLite file) for the security tests."""

from tests.api.conftest import api, api_app_factory  # noqa: F401
