"""The reference model: the expected terminal state of every (event, user, channel),
written from the rules as stated in the issues and seeds, in plain Python, without
the pipeline's code."""

from dataclasses import dataclass, field
from typing import Optional

# categories as in config/defaults.toml
CATEGORIES = {
    "otp": dict(priority="high", limit=None, fallback=False, default=["sms"]),
    "security": dict(priority="high", limit=None, fallback=False, default=["push", "sms", "email", "inbox"]),
    "transaction": dict(priority="normal", limit=20, fallback=True, default=["push", "inbox"]),
    "marketing": dict(priority="low", limit=3, fallback=True, default=["push", "email"],
                      # at most 1 in 10 minutes, 3 in an hour; a test runs well inside ten minutes,
                      # so a user's second marketing notification is refused
                      windows=[(600, 1), (3600, 3)]),
}
# which template exists for which channel (config/templates, v1) and the params each needs
TEMPLATES = {
    "otp": ({"sms", "push", "email", "inbox"}, {"code"}),
    "order_shipped": ({"sms", "push", "email", "inbox", "webhook"}, {"order_no", "carrier", "tracking_no", "tracking_url"}),
    "promo": ({"push", "email", "inbox"}, {"headline", "discount", "url"}),
    "welcome": ({"email", "inbox"}, {"url"}),
}
NEEDS = {  # params each channel's template uses without a default
    ("order_shipped", "push"): {"order_no", "carrier"},
    ("welcome", "inbox"): set(),
}


@dataclass
class User:
    id: str
    phone: Optional[str] = None
    email: Optional[str] = None
    device: Optional[str] = None
    off: set = field(default_factory=set)  # "category.channel" or "category.*" switched off
    quiet: bool = False  # in quiet hours for the whole test

    def switched_off(self, category: str, channel: str) -> bool:
        return f"{category}.{channel}" in self.off or f"{category}.*" in self.off

    def reachable(self, channel: str) -> bool:
        return {"inbox": True, "push": bool(self.device), "sms": bool(self.phone), "email": bool(self.email)}.get(channel, False)


def provider_result(user: User, channel: str) -> tuple[str, Optional[str]]:
    if channel == "inbox":
        return "DELIVERED", "in_inbox"
    if channel == "sms" and user.phone and user.phone.endswith("0001"):
        return "FAILED", "invalid_number"
    if channel == "sms" and user.phone and user.phone.endswith("0004"):
        return "ACCEPTED", "reconciled"  # timed out after the provider took it; a query found it
    return "ACCEPTED", None


class Model:
    def __init__(self, users: dict[str, User], windows: bool = True) -> None:
        """``windows``: the sliding windows of config/defaults.toml apply (the fault
        drills turn them off: tests/faults/drill.py DRILL_CONFIG)."""
        self.users = users
        self.windows = windows
        self.expected: dict[tuple[str, str, str], tuple[str, Optional[str]]] = {}
        self.count: dict[tuple[str, str], int] = {}
        self.dead_letters = 0

    def event(self, ev: dict) -> None:
        if ev.get("_bad"):
            self.dead_letters += 1
            return
        for uid in ev["recipients"]:
            self.one(ev, self.users[uid])

    def one(self, ev: dict, user: User) -> None:
        cat = CATEGORIES[ev["category"]]
        wanted = list(dict.fromkeys(ev.get("channels") or cat["default"]))
        keys = [(ev["biz_key"], user.id, c) for c in wanted]
        if any(k in self.expected for k in keys):
            return  # the same notification again (a duplicate or a replay): nothing new
        usable = [c for c in wanted if not user.switched_off(ev["category"], c) and user.reachable(c)]
        if not usable and cat["fallback"] and not user.switched_off(ev["category"], "inbox"):
            usable = ["inbox"]
        for c in wanted:
            if c not in usable:
                self.expected[(ev["biz_key"], user.id, c)] = (
                    "FILTERED", "opted_out" if user.switched_off(ev["category"], c) else "unreachable")
        if not usable:
            return
        if user.quiet and cat["priority"] != "high":
            for c in usable:
                self.expected[(ev["biz_key"], user.id, c)] = ("SCHEDULED", "deferred")
            return
        n = self.count.get((user.id, ev["category"]), 0)
        if cat["limit"] is not None and n >= cat["limit"]:
            for c in usable:
                self.expected[(ev["biz_key"], user.id, c)] = ("FILTERED", "over_limit")
            return
        if self.windows and any(n >= most for _w, most in cat.get("windows", ())):
            for c in usable:
                self.expected[(ev["biz_key"], user.id, c)] = ("FILTERED", "rate_window")
            return
        self.count[(user.id, ev["category"])] = n + 1
        channels_ok, needs = TEMPLATES[ev["template"]]
        for c in usable:
            need = NEEDS.get((ev["template"], c), needs)
            if c not in channels_ok or not need <= set(ev.get("params", {})):
                self.expected[(ev["biz_key"], user.id, c)] = ("FAILED", "template_error")
            else:
                self.expected[(ev["biz_key"], user.id, c)] = provider_result(user, c)
