"""Gray release (seed 002): a new template version or a new channel goes to
internal users first, then to a percentage of users, then to everyone.

A release names either a template and the version being released, or a channel,
and a stage:

    off        nobody
    internal   the listed internal users
    percent    the internal users and ``percent`` % of the others
    all        everyone

Who is in is decided per user, deterministically: the user's bucket is
``blake2b(release name, user id)`` mapped to [0, 100), so raising the percentage
only ever adds users, and the same user gets the same answer in every worker.

A template release applies when an event asks for an older version than the one
released (an event that names the new version gets it whatever the stage); a
user in the release gets the released version, the others the version asked
for. The version used is kept with each record (``template_version``). A
channel under release is used only for the users in it; for the others it is
``FILTERED not_released``.
"""

from __future__ import annotations

from dataclasses import dataclass
from hashlib import blake2b
from collections.abc import Mapping  # (isinstance with typing's alias is a few Python calls)
from typing import Any, Iterable, Optional

__all__ = ["Release", "STAGES", "NOT_RELEASED", "bucket", "reaches", "template_version", "channel_held",
           "parse_release"]

STAGES = ("off", "internal", "percent", "all")
NOT_RELEASED = "not_released"


@dataclass(frozen=True)
class Release:
    name: str
    stage: str = "off"
    template: Optional[str] = None
    version: Optional[int] = None
    channel: Optional[str] = None
    internal_users: tuple[str, ...] = ()
    percent: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "stage": self.stage, "template": self.template, "version": self.version,
                "channel": self.channel, "internal_users": list(self.internal_users), "percent": self.percent}


def bucket(name: str, user_id: str) -> float:
    """The user's place in [0, 100) for this release."""
    h = int.from_bytes(blake2b(f"{name}\x1f{user_id}".encode(), digest_size=8).digest(), "big")
    return h * 100.0 / 2**64


def reaches(r: Release, user_id: str) -> bool:
    if r.stage == "all":
        return True
    if r.stage == "off":
        return False
    if user_id in r.internal_users:
        return True
    return r.stage == "percent" and bucket(r.name, user_id) < r.percent


def template_version(releases: Iterable[Release], template: str, requested: int, user_id: str) -> int:
    """The version of ``template`` this user gets for an event asking for ``requested``."""
    best = requested
    for r in releases:
        if r.template == template and r.version is not None and r.version > best and reaches(r, user_id):
            best = r.version
    return best


def channel_held(releases: Iterable[Release], channel: str, user_id: str) -> bool:
    """Whether ``channel`` is under release and this user is not in it yet."""
    held = [r for r in releases if r.channel == channel]
    return bool(held) and not any(reaches(r, user_id) for r in held)


def parse_release(name: str, raw: Mapping[str, Any], channels: Iterable[str]) -> Release:
    """A release from config or the API; ``ValueError`` naming the field."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"releases.{name}: a table")
    unknown = set(raw) - {"stage", "template", "version", "channel", "internal_users", "percent", "name"}
    if unknown:
        raise ValueError(f"releases.{name}.{sorted(unknown)[0]}: unknown setting")
    stage = raw.get("stage", "off")
    if stage not in STAGES:
        raise ValueError(f"releases.{name}.stage: one of {', '.join(STAGES)}")
    template, version, channel = raw.get("template"), raw.get("version"), raw.get("channel")
    if (template is None) == (channel is None):
        raise ValueError(f"releases.{name}: a template (with its version) or a channel")
    if template is not None:
        if not isinstance(template, str) or not template:
            raise ValueError(f"releases.{name}.template: a template name")
        if isinstance(version, bool) or not isinstance(version, int) or version < 2:
            raise ValueError(f"releases.{name}.version: the version released, an integer ≥ 2")
    if channel is not None and channel not in tuple(channels):
        raise ValueError(f"releases.{name}.channel: unknown channel {str(channel)[:32]!r}")
    users = raw.get("internal_users", [])
    if not isinstance(users, list) or not all(isinstance(u, str) and 0 < len(u) <= 128 for u in users):
        raise ValueError(f"releases.{name}.internal_users: a list of user ids")
    percent = raw.get("percent", 0.0)
    if isinstance(percent, bool) or not isinstance(percent, (int, float)) or not 0 <= percent <= 100:
        raise ValueError(f"releases.{name}.percent: a number in 0..100")
    return Release(name=name, stage=stage, template=template, version=version if template else None,
                   channel=channel, internal_users=tuple(dict.fromkeys(users)), percent=float(percent))
