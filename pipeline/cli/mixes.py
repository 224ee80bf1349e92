"""The users and events of generated load, written once.

* ``notify demo``'s mix (:func:`demo_users`, :func:`demo_events`): against the
  provider simulators, so a few phone numbers are their failure scenarios, some
  users have no address, quiet hours or marketing switched off; otp 25%,
  transaction 35%, marketing 35%, security 5%.
* the benchmarks' mix (:class:`User`, :func:`make_users`, :func:`make_events`,
  :func:`mix_event`): bench/e2e.py, bench/soak.py (endless, :func:`mix_event`
  one at a time), bench/celery_peer.py; addresses the fakes always accept; otp
  30%, transaction 45%, marketing 20%, a duplicate 5%.

The benchmarks that measure one path use mixes of their own on purpose
(bench/real.py: a campaign and OTPs at a fixed rate; bench/otp.py: a marketing
backlog; bench/api.py and bench/ingest.py: one transaction event each).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["demo_users", "demo_events", "User", "make_users", "mix_event", "make_events", "DUPLICATES"]


# -- notify demo ---------------------------------------------------------------


def demo_users(n: int, rng: random.Random) -> tuple[list[dict], list[dict]]:
    """``n`` users ``demo0``…: their preferences and push devices."""
    prefs, devices = [], []
    hour = time.gmtime().tm_hour
    for i in range(n):
        uid = f"demo{i}"
        p: dict[str, Any] = {"user_id": uid, "version": 1, "tz": rng.choice(["UTC", "Europe/Paris", "Asia/Shanghai"])}
        r = rng.random()
        if r < 0.8:
            # mostly ordinary numbers; a few simulator scenarios (see adapters/simulators)
            tail = rng.choice(["1234"] * 40 + ["0001", "0002", "0004", "0006"])
            p["phone"] = f"+1555{i:04d}{tail}"
        if r < 0.7:
            p["email"] = f"user{i}@example.com"
        if rng.random() < 0.05:
            p["switches"] = {"marketing.*": False}
        if rng.random() < 0.05:
            p["quiet_hours"] = f"{(hour - 1) % 24:02d}:00-{(hour + 2) % 24:02d}:00"
            p["tz"] = "UTC"
        prefs.append(p)
        if rng.random() < 0.5:
            devices.append({"user_id": uid, "token": f"tok{i:06d}", "platform": rng.choice(["apns", "fcm"]), "op": "add"})
    return prefs, devices


def demo_events(n: int, users: int, rng: random.Random, run_id: str) -> list[dict]:
    """``n`` events to the users of :func:`demo_users`, business keys ``demo:<run_id>:<i>``."""
    out = []
    for i in range(n):
        r = rng.random()
        to = [f"demo{rng.randrange(users)}" for _ in range(rng.choice([1, 1, 2, 3, 5]))]
        if r < 0.25:
            ev = {"category": "otp", "template": "otp", "channels": ["sms"], "params": {"code": f"{rng.randrange(10**6):06d}"},
                  "recipients": to[:1]}
        elif r < 0.6:
            ev = {"category": "transaction", "template": "order_shipped", "recipients": to,
                  "params": {"order_no": f"A{i}", "carrier": "UPS", "tracking_no": f"1Z{i}", "tracking_url": "https://t"}}
        elif r < 0.95:
            ev = {"category": "marketing", "template": "promo", "recipients": to, "channels": ["push", "email"],
                  "params": {"headline": "Winter sale", "discount": "20%", "url": "https://shop"}}
        else:
            ev = {"category": "security", "template": "security_alert", "recipients": to[:1],
                  "channels": ["push", "email", "inbox"], "params": {"event": "New sign-in", "action_url": "https://sec"}}
        ev["biz_key"] = f"demo:{run_id}:{i}"
        ev["accepted_at"] = time.time()
        out.append(ev)
    return out


# -- the benchmarks ------------------------------------------------------------

#: the share of events that repeat an earlier one's business key
DUPLICATES = 0.05


@dataclass
class User:
    id: str
    phone: Optional[str] = None
    email: Optional[str] = None
    device: Optional[str] = None  # push token (apns)
    off: tuple = ()  # switched-off "<category>.<channel>" patterns
    quiet: bool = False

    def prefs(self, hour: int) -> dict:
        p: dict = {"user_id": self.id, "version": 1, "tz": "UTC"}
        if self.phone:
            p["phone"] = self.phone
        if self.email:
            p["email"] = self.email
        if self.off:
            p["switches"] = {k: False for k in self.off}
        if self.quiet:  # quiet hours around now: normal/low are deferred, high goes through
            p["quiet_hours"] = f"{(hour - 1) % 24:02d}:00-{(hour + 3) % 24:02d}:00"
        return p


def make_users(n: int, rng: random.Random) -> list[User]:
    """Addresses end in ...99 so the fakes' failure scenarios (last four digits
    0001/0002/0004/0006/0007) never trigger: every send is accepted first time."""
    users = []
    for i in range(n):
        r = rng.random()
        u = User(f"u{i}")
        if r < 0.92:
            u.phone = f"+1555{i:06d}99"
        if r < 0.85:
            u.email = f"user{i}99@example.com"
        if rng.random() < 0.55:
            u.device = f"tok{i:06d}99"
        if rng.random() < 0.10:
            u.off = ("marketing.*",)
        elif rng.random() < 0.03:
            u.off = ("transaction.push",)
        if rng.random() < 0.02:
            u.quiet = True
        users.append(u)
    return users


def mix_event(r: float, rng: random.Random, ids: list[str], i: int, tag: str = "") -> dict:
    """Event ``i`` of the benchmarks' mix, for the draw ``r`` (``rng.random()``, the
    caller's: below :data:`DUPLICATES` it may repeat an earlier event instead), to
    users ``ids``; business key ``<tag><category>:<i>``."""
    if r < 0.35:
        ev = {"category": "otp", "template": "otp", "channels": ["sms"], "recipients": [rng.choice(ids)],
              "params": {"code": f"{rng.randrange(10**6):06d}"}}
    elif r < 0.80:
        ev = {"category": "transaction", "template": "order_shipped",
              "recipients": rng.sample(ids, rng.randint(1, 2)),
              "params": {"order_no": f"O{i}", "carrier": "UPS", "tracking_no": f"1Z{i:08d}",
                         "tracking_url": f"https://t.example/{i}"}}
        if rng.random() < 0.3:
            ev["channels"] = ["sms", "email"]
    else:
        ev = {"category": "marketing", "template": "promo", "channels": ["push", "email"],
              "recipients": rng.sample(ids, rng.randint(1, 3)),
              "params": {"headline": "Winter sale", "discount": "20%", "url": "https://shop.example/sale"}}
    ev["biz_key"] = f"{tag}{ev['category']}:{i}"
    return ev


def make_events(n: int, users: list[User], rng: random.Random) -> list[dict]:
    """otp 30% (one recipient, sms), transaction 45% (1-2 recipients, default
    channels push+inbox, or 30% of them sms+email), marketing 20% (1-3 recipients, push+email),
    duplicates ~5% (an earlier event's business key again)."""
    ids = [u.id for u in users]
    events: list[dict] = []
    i = 0
    while len(events) < n:
        i += 1
        r = rng.random()
        if r < DUPLICATES and events:
            events.append(dict(rng.choice(events)))
            continue
        events.append(mix_event(r, rng, ids, i))
    return events
