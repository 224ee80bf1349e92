"""What happens to one intent (one event for one user): the guard's decisions, in
the order of seed 000's GUARD and DESIGN.md, as one pure function.

    channels (opt-out, reachability, inbox fallback)
    → backpressure (throttled categories wait while the pipeline is behind)
    → quiet hours / send_at (normal and low deferred; high goes through)
    → dedup per (biz_key, user, channel) within the category's window
    → daily limit per user × category (security/OTP exempt), counted once per notification
    → sliding windows per user × category (seed 002; ``rate_windows``), counted likewise
    → render per channel (a template problem fails that channel only); links in
      email, push and inbox content rewritten to the signed redirect (tracking.py);
      a category with ``one_click_unsubscribe`` gets the user's signed unsubscribe
      link: ``unsubscribe_url`` for the email, push and inbox templates that use it
      (an event's own ``unsubscribe_url`` param wins), and ``content["unsubscribe_url"]``
      on an email (for its ``List-Unsubscribe`` header: tracking.list_unsubscribe_headers)
    → one Delivery per channel, PENDING; push: one per device of the user (the most
      recently registered first, at most ``[channels.push] max_devices``), each with
      its own delivery id ``<record's delivery_id>.<device digest>``, under the one
      record of the channel (docs/SCHEMA.md "Push to every device")

Every requested channel ends with a record: FILTERED with the reason, SCHEDULED,
FAILED ``template_error``, or PENDING (then the lane takes over). A duplicate maps to
the same delivery id as the original, so it creates nothing: it is reported on the
outcome stream as FILTERED ``duplicate`` and the record keeps the original's state.
"""

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from pipeline.ids import delivery_id, device_delivery_id, scoped
from pipeline.models import Delivery, Intent, Outcome, State, Timer
from pipeline.templates import TemplateError

from . import channels as ch
from . import guard
from . import release
from . import tracking
from .backpressure import BACKPRESSURE, throttled
from .quiet_hours import channel_quiet_ends

__all__ = ["Plan", "plan_intent", "outcome", "DUPLICATE", "OVER_LIMIT", "RATE_WINDOW", "TEMPLATE_ERROR", "UNSUBSCRIBED"]

DUPLICATE = "duplicate"
OVER_LIMIT = "over_limit"
RATE_WINDOW = "rate_window"
TEMPLATE_ERROR = "template_error"
UNSUBSCRIBED = "unsubscribed"


@dataclass
class Plan:
    outcomes: list[Outcome] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    dedup_keys: list[str] = field(default_factory=list)  # to record as seen now
    counter_key: Optional[str] = None  # daily counter to increment by one
    window: Optional[tuple[str, list]] = None  # sliding-window key and the send times to keep
    #: the intent deferred (send_at, quiet hours): one timer, or one per group of
    #: channels with the same end of their quiet hours (per-channel quiet hours)
    timers: list[Timer] = field(default_factory=list)
    #: no channel was left (preferences, reachability, no inbox fallback): the reason, for an alert
    no_channel: Optional[str] = None
    #: devices of the user a push did not go to: over ``[channels.push] max_devices``
    devices_not_sent: int = 0

    @property
    def timer(self) -> Optional[Timer]:
        return self.timers[0] if self.timers else None


def dedup_key(user_id: str, biz_key: str, channel: str, producer: str = "") -> str:
    """The dedup rule's key: (user, business key in its producer's space, channel).
    Stored per intent (:func:`dedup_entry_key`, agents/guard.py): this is the name the
    plan asks about and the key a table of before this release holds."""
    return f"{user_id}|{scoped(biz_key, producer)}|{channel}"


#: ends the key of a dedup entry of an intent's channels (a channel name ends the others)
ENTRY_SUFFIX = "|*"


def dedup_entry_key(user_id: str, biz_key: str, producer: str = "") -> str:
    """The dedup table's key for every channel of a (user, business key): one changelog
    entry per intent, ``[newest seen, its replay token, category, {channel: [seen,
    replay token]}]``, instead of one per channel. It cannot be a per-channel key
    (those end with a channel name)."""
    return f"{user_id}|{scoped(biz_key, producer)}{ENTRY_SUFFIX}"


def outcome(src: Any, channel: str, state: str, now: float, **kw: Any) -> Outcome:
    """An Outcome for ``src`` (Intent or Delivery) on ``channel``."""
    return Outcome(
        delivery_id=getattr(src, "delivery_id", None) or delivery_id(src.biz_key, src.user_id, channel, src.producer),
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
        producer=src.producer,
        pref_version=getattr(src, "pref_version", 0),
        template_version=getattr(src, "template_version", 0),
        devices=getattr(src, "devices", 0),
        callback=getattr(src, "callback", False),
        **kw,
    )


def _address(channel: str, prefs: Any, devices: Optional[list]) -> str:
    if channel == "push":
        return ""  # one delivery per device: push_targets
    return ch.address_for(prefs, channel) or ""


def push_targets(devices: Optional[list], cap: int) -> tuple[list[tuple[str, str]], int]:
    """The devices a push goes to, ``[(platform, token), ...]``, the most recently
    registered first (``devices`` is the table's ``[[platform, token, at], ...]``),
    at most ``cap``; and how many were left out."""
    seen: set[str] = set()
    ordered = []
    for i, dev in sorted(enumerate(devices or ()), key=lambda e: (_registered(e[1]), e[0]), reverse=True):
        if dev[1] not in seen:
            seen.add(dev[1])
            ordered.append((dev[0], dev[1]))
    return ordered[:cap], max(0, len(ordered) - cap)


def _registered(dev: list) -> float:
    at = dev[2] if len(dev) > 2 else 0
    return at if isinstance(at, (int, float)) else 0


def per_device(d: Delivery, devices: Optional[list], cap: int) -> tuple[list[Delivery], int]:
    """A push delivery as one delivery per device (docs/SCHEMA.md "Push to every
    device"): each with its own id (the record's id and the device's digest), its
    device's address and the number of devices it went to; and how many devices
    were left out (over ``cap``, the oldest)."""
    targets, left_out = push_targets(devices, cap)
    base = d.asdict()
    out = []
    for platform, token in targets:
        base.update(delivery_id=device_delivery_id(d.delivery_id, platform, token), address=f"{platform}:{token}",
                    devices=len(targets))
        out.append(Delivery(**base))
    return out, left_out


def _defer(plan: Plan, intent: Intent, chosen: list[str], prefs: Any, now: float) -> list[str]:
    """Hold the channels that must wait (``send_at``; quiet hours, each channel by
    its own windows) on timers, one per end time; returns the channels to send now.
    All channels waiting together keep the one timer id ``<nid>:intent``."""
    send_at = intent.send_at if intent.send_at and intent.send_at > now else None
    quiet = channel_quiet_ends(intent.priority, prefs, chosen, now)
    dues: dict[str, Optional[float]] = {c: max(send_at or 0.0, quiet[c] or 0.0) or None for c in chosen}
    groups: dict[float, list[str]] = {}
    for c in chosen:
        if dues[c] is not None:
            groups.setdefault(dues[c], []).append(c)
    for due, chans in sorted(groups.items()):
        plan.outcomes += [outcome(intent, c, State.SCHEDULED, now, reason="deferred") for c in chans]
        payload = intent.asdict()
        payload["resumed"] = True
        payload["channels"] = chans  # the snapshot taken now; re-checked when it fires
        tid = f"{intent.notification_id}:intent" + ("" if len(chans) == len(chosen) else ":" + "+".join(chans))
        plan.timers.append(Timer(timer_id=tid, due_at=due, kind="intent", payload=payload))
    return [c for c in chosen if dues[c] is None]


def _unsubscribe_url(tracker: Any, cat: Any, intent: Intent, channel: str) -> Optional[str]:
    """The user's one-click unsubscribe link of this category and channel, or None
    (tracking off, a category that cannot be refused, a channel without one)."""
    if tracker is None or not getattr(cat, "one_click_unsubscribe", False) \
            or channel not in tracking.UNSUBSCRIBE_CHANNELS:
        return None
    try:
        return tracking.unsubscribe_url(tracker, intent.user_id, intent.category, channel, intent.producer)
    except ValueError:
        return None


def _uses(renderer: Any, code: str, version: int, channel: str, locale: Optional[str], name: str) -> bool:
    mentions = getattr(renderer, "mentions", None)
    return True if mentions is None else bool(mentions(code, version, channel, locale, name))


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
    recent_sends: Optional[Callable[[str], list]] = None,
    backpressure: bool = False,
    releases: tuple = (),
    tracker: Any = None,
) -> Plan:
    """The plan for one intent; every outcome carries the preferences version
    the decision was taken with (kept in the record store: "why did this user
    (not) get it" can be answered after the preferences changed)."""
    plan = _plan(intent, settings, renderer, prefs, devices, now, dedup_seen, count_today, recent_sends, backpressure,
                 releases, tracker)
    version = getattr(prefs, "version", 0) or 0
    for o in plan.outcomes:
        o.pref_version = version
    return plan


def _plan(intent: Intent, settings: Any, renderer: Any, prefs: Any, devices: Optional[list], now: float,
          dedup_seen: Callable[[str], Optional[float]], count_today: Callable[[str], int],
          recent_sends: Optional[Callable[[str], list]], backpressure: bool, releases: tuple,
          tracker: Any = None) -> Plan:
    plan = Plan()
    cat = settings.category(intent.category)
    wanted = list(dict.fromkeys(intent.channels or cat.default_channels))
    # a notification coming back from the scheduler never falls back to another
    # channel the user did not choose: an unsubscribe while it waited is final
    pick_cat = replace(cat, inbox_fallback=False) if intent.resumed else cat
    # a channel under gray release is there only for the users it reached
    held = {c for c in (*wanted, "inbox") if release.channel_held(releases, c, intent.user_id)}
    open_ = [c for c in wanted if c not in held]
    chosen, no_channel = ch.pick_channels(open_, pick_cat, prefs, bool(devices)) if open_ else ([], None)
    chosen = [c for c in chosen if c not in held]
    for channel in wanted:
        if channel in held:
            plan.outcomes.append(outcome(intent, channel, State.FILTERED, now, reason=release.NOT_RELEASED))
        elif channel not in chosen:
            off = ch.is_unsubscribed(prefs, cat.name, channel)
            why = ch.OPTED_OUT if off else ch.UNREACHABLE
            if off and intent.resumed:
                why = UNSUBSCRIBED  # switched off while the notification waited: the later choice wins
            plan.outcomes.append(outcome(intent, channel, State.FILTERED, now, reason=why))
    if not chosen:
        plan.no_channel = no_channel or (ch.UNREACHABLE if open_ else release.NOT_RELEASED)
        return plan

    bp = settings.backpressure
    if throttled(intent.category, intent.priority, backpressure, bp.categories):
        # the pipeline is behind: this waits, OTPs and transactional traffic go first
        plan.outcomes += [outcome(intent, c, State.SCHEDULED, now, reason=BACKPRESSURE) for c in chosen]
        payload = intent.asdict()
        payload["deferrals"] = intent.deferrals + 1
        plan.timers.append(Timer(timer_id=f"{intent.notification_id}:backpressure:{intent.deferrals}",
                                 due_at=now + bp.retry_s, kind="intent", payload=payload))
        return plan

    if not intent.resumed:
        chosen = _defer(plan, intent, chosen, prefs, now)
        if not chosen:
            return plan

    fresh = []
    for channel in chosen:
        if guard.is_duplicate(dedup_seen(dedup_key(intent.user_id, intent.biz_key, channel, intent.producer)), now, cat.dedup_window_s):
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
    if cat.rate_windows:
        wkey = guard.window_key(intent.user_id, intent.category)
        times = recent_sends(wkey) if recent_sends is not None else []
        if guard.window_refused(times, now, cat.rate_windows):
            plan.outcomes += [outcome(intent, c, State.FILTERED, now, reason=RATE_WINDOW) for c in fresh]
            return plan
        plan.window = (wkey, guard.window_after(times, now, cat.rate_windows))
    if cat.daily_limit is not None:
        plan.counter_key = counter

    locale = intent.locale or getattr(prefs, "locale", None)
    version = getattr(prefs, "version", 0) or 0
    for channel in fresh:
        plan.dedup_keys.append(dedup_key(intent.user_id, intent.biz_key, channel, intent.producer))
        unsub = _unsubscribe_url(tracker, cat, intent, channel)
        try:
            tv = release.template_version(releases, intent.template, intent.template_version, intent.user_id)
            params = intent.params
            if unsub is not None and "unsubscribe_url" not in params and _uses(renderer, intent.template, tv, channel,
                                                                                locale, "unsubscribe_url"):
                params = {**params, "unsubscribe_url": unsub}
            content = renderer.render(intent.template, tv, channel, locale, params)
        except TemplateError as exc:
            plan.outcomes.append(outcome(intent, channel, State.FAILED, now, reason=TEMPLATE_ERROR, detail=str(exc)))
            continue
        did = delivery_id(intent.biz_key, intent.user_id, channel, intent.producer)
        if tracker is not None:  # links → the API's signed redirect (rules/tracking.py)
            content, _links = tracking.rewrite(tracker, channel, did, content)
        if unsub is not None and channel == "email":
            content["unsubscribe_url"] = unsub
        d = Delivery(
            delivery_id=did,
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
            producer=intent.producer,
            template_version=tv,
            callback=intent.callback,
        )
        if channel == "push":
            cap = settings.channels["push"].max_devices
            each, plan.devices_not_sent = per_device(d, devices, cap)
            note = (f"sent to the {cap} most recently registered of {cap + plan.devices_not_sent} devices"
                    if plan.devices_not_sent else None)
            plan.deliveries += each
            plan.outcomes += [outcome(e, channel, State.PENDING, now, detail=note) for e in each]
            continue
        plan.deliveries.append(d)
        plan.outcomes.append(outcome(d, channel, State.PENDING, now))
    return plan
