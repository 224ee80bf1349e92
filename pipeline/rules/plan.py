"""What happens to one intent (one event for one user): the guard's decisions, in
the order of seed 000's GUARD and DESIGN.md, as one pure function.

    channels (opt-out, reachability, inbox fallback)
    → quiet hours / send_at (normal and low deferred; high goes through)
    → dedup per (biz_key, user, channel) within the category's window
    → daily limit per user × category (security/OTP exempt), counted once per notification
    → render per channel (a template problem fails that channel only)
    → one Delivery per channel, PENDING

Every requested channel ends with a record: FILTERED with the reason, SCHEDULED,
FAILED ``template_error``, or PENDING (then the lane takes over). A duplicate maps to
the same delivery id as the original, so it creates nothing: it is reported on the
outcome stream as FILTERED ``duplicate`` and the record keeps the original's state.
"""

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from pipeline.ids import delivery_id
from pipeline.models import Delivery, Intent, Outcome, Priority, State, Timer
from pipeline.templates import TemplateError

from . import channels as ch
from . import guard
from .quiet_hours import defer_decision

__all__ = ["Plan", "plan_intent", "outcome", "DUPLICATE", "OVER_LIMIT", "TEMPLATE_ERROR", "UNSUBSCRIBED"]

DUPLICATE = "duplicate"
OVER_LIMIT = "over_limit"
TEMPLATE_ERROR = "template_error"
UNSUBSCRIBED = "unsubscribed"


@dataclass
class Plan:
    outcomes: list[Outcome] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    dedup_keys: list[str] = field(default_factory=list)  # to record as seen now
    counter_key: Optional[str] = None  # daily counter to increment by one
    timer: Optional[Timer] = None  # the intent, deferred


def dedup_key(user_id: str, biz_key: str, channel: str) -> str:
    return f"{user_id}|{biz_key}|{channel}"


def outcome(src: Any, channel: str, state: str, now: float, **kw: Any) -> Outcome:
    """An Outcome for ``src`` (Intent or Delivery) on ``channel``."""
    return Outcome(
        delivery_id=getattr(src, "delivery_id", None) or delivery_id(src.biz_key, src.user_id, channel),
        notification_id=src.notification_id,
        biz_key=src.biz_key,
        user_id=src.user_id,
        channel=channel,
        category=src.category,
        template=src.template,
        priority=src.priority,
        state=state,
        at=now,
        accepted_at=src.accepted_at,
        latency_ms=max(0.0, (now - src.accepted_at) * 1000.0) if src.accepted_at else 0.0,
        **kw,
    )


def _address(channel: str, prefs: Any, devices: Optional[list]) -> str:
    if channel == "push":
        platform, token = devices[-1][0], devices[-1][1]
        return f"{platform}:{token}"
    return ch.address_for(prefs, channel) or ""


def plan_intent(
    intent: Intent,
    *,
    settings: Any,
    renderer: Any,
    prefs: Any,
    devices: Optional[list],
    now: float,
    dedup_seen: Callable[[str], Optional[float]],
    count_today: Callable[[str], int],
) -> Plan:
    plan = Plan()
    cat = settings.category(intent.category)
    wanted = list(dict.fromkeys(intent.channels or cat.default_channels))
    # a notification coming back from the scheduler never falls back to another
    # channel the user did not choose: an unsubscribe while it waited is final
    pick_cat = replace(cat, inbox_fallback=False) if intent.resumed else cat
    chosen, _reason = ch.pick_channels(intent.channels, pick_cat, prefs, bool(devices))
    for channel in wanted:
        if channel not in chosen:
            off = ch.is_unsubscribed(prefs, cat.name, channel)
            why = ch.OPTED_OUT if off else ch.UNREACHABLE
            if off and intent.resumed:
                why = UNSUBSCRIBED  # switched off while the notification waited: the later choice wins
            plan.outcomes.append(outcome(intent, channel, State.FILTERED, now, reason=why))
    if not chosen:
        return plan

    if not intent.resumed:
        due = intent.send_at if intent.send_at and intent.send_at > now else None
        tz = getattr(prefs, "tz", "UTC") or "UTC"
        quiet_end = defer_decision(intent.priority, getattr(prefs, "quiet_hours", None), tz, now)
        if quiet_end and intent.priority != Priority.HIGH:
            due = max(due or 0.0, quiet_end)
        if due:
            plan.outcomes += [outcome(intent, c, State.SCHEDULED, now, reason="deferred") for c in chosen]
            payload = intent.asdict()
            payload["resumed"] = True
            payload["channels"] = chosen  # the snapshot taken now; re-checked when it fires
            plan.timer = Timer(
                timer_id=f"{intent.notification_id}:intent", due_at=due, kind="intent", payload=payload
            )
            return plan

    fresh = []
    for channel in chosen:
        if guard.is_duplicate(dedup_seen(dedup_key(intent.user_id, intent.biz_key, channel)), now, cat.dedup_window_s):
            plan.outcomes.append(outcome(intent, channel, State.FILTERED, now, reason=DUPLICATE))
        else:
            fresh.append(channel)
    if not fresh:
        return plan

    day = guard.day_key(getattr(prefs, "tz", None), now)
    counter = guard.counter_key(intent.user_id, intent.category, day)
    if cat.daily_limit is not None:
        if count_today(counter) >= cat.daily_limit:
            plan.outcomes += [outcome(intent, c, State.FILTERED, now, reason=OVER_LIMIT) for c in fresh]
            return plan
        plan.counter_key = counter

    locale = intent.locale or getattr(prefs, "locale", None)
    version = getattr(prefs, "version", 0) or 0
    for channel in fresh:
        plan.dedup_keys.append(dedup_key(intent.user_id, intent.biz_key, channel))
        try:
            content = renderer.render(intent.template, intent.template_version, channel, locale, intent.params)
        except TemplateError as exc:
            plan.outcomes.append(outcome(intent, channel, State.FAILED, now, reason=TEMPLATE_ERROR, detail=str(exc)))
            continue
        d = Delivery(
            delivery_id=delivery_id(intent.biz_key, intent.user_id, channel),
            notification_id=intent.notification_id,
            biz_key=intent.biz_key,
            user_id=intent.user_id,
            channel=channel,
            category=intent.category,
            template=intent.template,
            priority=intent.priority,
            address=_address(channel, prefs, devices),
            content=content,
            pref_version=version,
            accepted_at=intent.accepted_at,
        )
        plan.deliveries.append(d)
        plan.outcomes.append(outcome(d, channel, State.PENDING, now))
    return plan
