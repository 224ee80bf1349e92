"""releases: the gray releases in force (pipeline/rules/release.py), the
config's merged with those set through the API (``Keys.releases``, by name: the
API's win), read every 2 s; the guard plans with them."""

import logging
from typing import Any

import orjson

from config.settings import CHANNELS
from pipeline.rules.release import Release, parse_release

__all__ = ["Releases", "merged", "register"]

log = logging.getLogger("notify.releases")


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


class Releases:
    """What the guard uses now."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.current: tuple[Release, ...] = tuple(app.settings.releases)

    def releases(self) -> tuple[Release, ...]:
        return self.current

    async def refresh(self) -> None:
        """Read the releases set through the API again; while the broker is away (a
        master failing over, past the client's retries) the last ones stand: a timer
        that raised would crash the worker."""
        try:
            client = await self.app.resources.side_client()
            raw = await client.hgetall(self.app.transport.keys.releases)
        except Exception as exc:  # noqa: BLE001 - the broker is away: keep the last releases
            log.warning("releases: not read (%s); the last ones stand", exc)
            return
        self.current = merged(tuple(self.app.settings.releases), raw)


def register(app: Any) -> Releases:
    releases = Releases(app)
    app.timer(2.0, name="releases.refresh")(releases.refresh)
    return releases
