"""releases: the gray releases in force (pipeline/rules/release.py), the
config's merged with those set through the API (``Keys.releases``, by name: the
API's win), read every 2 s; the guard plans with them."""

import logging

import orjson

from pipeline.app import app, settings
from pipeline.rules.release import Release, parse_release
from config.settings import CHANNELS

from .pressure import side_client

log = logging.getLogger("notify.releases")

#: what the guard uses now
current: dict[str, tuple[Release, ...]] = {"releases": tuple(settings.releases)}


def releases() -> tuple[Release, ...]:
    return current["releases"]


def merged(config: tuple[Release, ...], raw: dict) -> tuple[Release, ...]:
    """The config's releases, replaced or added to by the API's (bad entries skipped)."""
    by_name = {r.name: r for r in config}
    for k, v in (raw or {}).items():
        name = k.decode() if isinstance(k, bytes) else str(k)
        try:
            by_name[name] = parse_release(name, orjson.loads(v), CHANNELS)
        except (ValueError, orjson.JSONDecodeError, TypeError):
            log.warning("skipping the release %r set through the API: it does not parse", name[:64])
    return tuple(by_name.values())


@app.timer(2.0)
async def refresh() -> None:
    client = await side_client()
    raw = await client.hgetall(app.transport.keys.releases)
    current["releases"] = merged(tuple(settings.releases), raw)
