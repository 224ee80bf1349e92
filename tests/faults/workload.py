"""The fault drills' workload: users, events and the reference model's verdict.

A generated mix (OTPs, order updates on default channels, marketing on push and
e-mail, a template missing a channel, duplicates of earlier business keys, bad
events), sized by the caller. Per-user counts stay under the daily limits, so
the expected records do not depend on the order in which partitions are read
(the daily limit itself is drilled by the clock scenario, in phases).

The expected state of every (biz_key, user, channel) comes from
tests/pipeline/model.py, which is written from the rules, not from the code.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Optional

import orjson

from tests.pipeline.model import Model, User

__all__ = ["Workload", "make_workload", "prefs_of", "devices_of"]


@dataclass
class Workload:
    users: dict[str, User]
    events: list[dict]  # wire form: dicts, or {"_bad": True, "raw": bytes}
    model: Model
    platforms: dict[str, str] = field(default_factory=dict)  # user → push platform

    @property
    def expected(self) -> dict[tuple[str, str, str], tuple[str, Optional[str]]]:
        return self.model.expected

    def good_events(self) -> list[dict]:
        return [e for e in self.events if not e.get("_bad")]

    def bad_count(self) -> int:
        return sum(1 for e in self.events if e.get("_bad"))


def prefs_of(u: User) -> dict:
    p: dict = {"user_id": u.id, "version": 1, "tz": "UTC"}
    if u.phone:
        p["phone"] = u.phone
    if u.email:
        p["email"] = u.email
    if u.off:
        p["switches"] = {k: False for k in u.off}
    return p


def devices_of(users: dict[str, User]) -> list[dict]:
    out = []
    for u in users.values():
        if u.device:
            platform, token = u.device.split(":", 1)
            out.append({"user_id": u.id, "token": token, "platform": platform, "op": "add"})
    return out


def make_users(n: int, prefix: str = "f") -> dict[str, User]:
    users: dict[str, User] = {}
    for i in range(n):
        uid = f"{prefix}{i}"
        kind = i % 6
        phone = f"+1555{i % 10000:04d}{i % 100:02d}99"  # ends in 99: no simulator scenario
        email = f"user{i}@example.com"
        if kind == 0:
            u = User(uid, phone, email, device=f"apns:tok{i}")
        elif kind == 1:
            u = User(uid, phone)
        elif kind == 2:
            u = User(uid, None, email, device=f"fcm:tok{i}")
        elif kind == 3:
            u = User(uid, phone, email, off={"marketing.*"})
        elif kind == 4:
            u = User(uid)  # reachable by the inbox only
        else:
            u = User(uid, phone, email, device=f"apns:tok{i}", off={"transaction.push"})
        users[uid] = u
    # provider scenarios by number (see adapters/simulators/common.py): a permanent
    # refusal, and "accepted, then no answer" (UNKNOWN, reconciled by a query)
    users[f"{prefix}-invalid"] = User(f"{prefix}-invalid", "+15550000001")
    users[f"{prefix}-uncertain"] = User(f"{prefix}-uncertain", "+15550000004")
    return users


def make_workload(n_events: int, seed: int = 1, *, prefix: str = "f", specials: int = 4,
                  bad_rate: float = 0.03) -> Workload:
    """``n_events`` events for ``max(60, n_events // 20)`` users. ``specials``: how
    many OTPs go to each of the two scenario users (the hanging one costs a
    provider timeout each)."""
    rng = random.Random(seed)
    users = make_users(max(60, n_events // 20), prefix)
    plain = [u for u in users if u[len(prefix):].isdigit()]
    per_tx: dict[str, int] = {}
    per_mkt: dict[str, int] = {}
    events: list[dict] = []

    def under(counter: dict[str, int], uid: str, cap: int) -> bool:
        if counter.get(uid, 0) >= cap:
            return False
        counter[uid] = counter.get(uid, 0) + 1
        return True

    special_left = {f"{prefix}-invalid": specials, f"{prefix}-uncertain": specials}
    i = 0
    while len(events) < n_events:
        i += 1
        r = rng.random()
        ev: dict
        if r < 0.3:
            to = [rng.choice(plain)]
            if special_left and rng.random() < 0.02:
                who = rng.choice(sorted(special_left))
                to = [who]
                special_left[who] -= 1
                if not special_left[who]:
                    del special_left[who]
            ev = {"category": "otp", "template": "otp", "channels": ["sms"], "params": {"code": f"{i % 1000000:06d}"}}
        elif r < 0.6:
            to = [u for u in rng.sample(plain, rng.randint(1, 3)) if under(per_tx, u, 19)]
            params = {"order_no": f"O{i}", "carrier": "UPS", "tracking_no": f"T{i}", "tracking_url": "https://t"}
            if rng.random() < 0.04:
                params.pop("carrier")  # a missing variable: template_error on push
            ev = {"category": "transaction", "template": "order_shipped", "params": params}
        elif r < 0.8:
            to = [u for u in rng.sample(plain, rng.randint(1, 4)) if under(per_mkt, u, 3)]
            ev = {"category": "marketing", "template": "promo", "channels": ["push", "email"],
                  "params": {"headline": "Sale", "discount": "10%", "url": "https://s"}}
        elif r < 0.84:
            to = [u for u in [rng.choice(plain)] if under(per_tx, u, 19)]
            ev = {"category": "transaction", "template": "welcome", "channels": ["email", "inbox", "sms"],
                  "params": {"url": "https://w"}}  # no sms template: template_error on sms
        elif r < 1 - bad_rate and events:
            dup = rng.choice([e for e in events[-200:] if not e.get("_bad")] or events)
            events.append(dict(dup))  # the same business key again
            continue
        else:
            bad = rng.choice([
                b"{not json", b"[]",
                orjson.dumps({"biz_key": f"bad{i}", "category": "nope", "template": "otp", "recipients": ["x"]}),
                orjson.dumps({"biz_key": f"bad{i}", "category": "otp", "template": "otp", "recipients": []}),
            ])
            events.append({"_bad": True, "raw": bad})
            continue
        if not to:
            continue
        ev["biz_key"] = f"{prefix}ev:{seed}:{i}"
        ev["recipients"] = to
        events.append(ev)
    model = Model(users, windows=False)  # the drills run without marketing's sliding windows
    for e in events:
        model.event(e)
    return Workload(users, events, model)


def wire(e: dict):
    return e["raw"] if e.get("_bad") else e
