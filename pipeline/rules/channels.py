"""Channel choice: which channels one notification goes out on for one user.

Rule: (requested channels, or the category's defaults) ∩ switched on by the user for
this category ∩ reachable (an address exists). If nothing is left: the inbox when the
category allows an inbox fallback and the user has not switched the inbox off for it;
otherwise no channel, with the reason ``opted_out`` (the user switched every requested
channel off) or ``unreachable`` (no address for any channel left on).

Switch lookup, most specific first: ``"<category>.<channel>"``; then ``"<category>.*"``
and ``"*.<channel>"`` (equally specific: when both are set and disagree, off wins);
then ``"*.*"``; anything not set is on.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from config.settings import CHANNELS

__all__ = [
    "OPTED_OUT",
    "UNREACHABLE",
    "switch_on",
    "is_unsubscribed",
    "address_for",
    "is_reachable",
    "pick_channels",
]

OPTED_OUT = "opted_out"
UNREACHABLE = "unreachable"

#: The Preferences field holding each channel's address (inbox and push need none).
_ADDRESS_FIELD = {"sms": "phone", "email": "email", "webhook": "webhook_url"}


def switch_on(prefs: Any, category: str, channel: str) -> bool:
    """Whether the user's switches let ``category`` reach them on ``channel``."""
    switches = getattr(prefs, "switches", None) if prefs is not None else None
    if not switches:
        return True
    exact = switches.get(f"{category}.{channel}")
    if exact is not None:
        return bool(exact)
    wild = [v for v in (switches.get(f"{category}.*"), switches.get(f"*.{channel}")) if v is not None]
    if wild:
        return all(bool(v) for v in wild)
    everything = switches.get("*.*")
    return True if everything is None else bool(everything)


def is_unsubscribed(prefs: Any, category: str, channel: str) -> bool:
    """The re-check just before a send: True when the user has switched this off."""
    return not switch_on(prefs, category, channel)


def address_for(prefs: Any, channel: str) -> Optional[str]:
    """The user's address on ``channel`` (phone, email, webhook URL), or None.
    Inbox and push have none here (push tokens live in the devices table)."""
    field = _ADDRESS_FIELD.get(channel)
    if field is None or prefs is None:
        return None
    value = getattr(prefs, field, None)
    return value or None


def is_reachable(channel: str, prefs: Any, has_device: bool) -> bool:
    """Inbox always; push with a device token; sms/email/webhook with an address."""
    if channel == "inbox":
        return True
    if channel == "push":
        return has_device
    if channel in _ADDRESS_FIELD:
        return address_for(prefs, channel) is not None
    return False  # unknown channel


def pick_channels(
    requested: Optional[Sequence[str]],
    category_cfg: Any,
    prefs: Any,
    has_device: bool,
) -> tuple[list[str], Optional[str]]:
    """``(channels in order, None)`` or ``([], "opted_out" | "unreachable")``.

    ``requested`` empty or None means the category's ``default_channels``; duplicates
    and unknown channels are dropped. ``prefs`` None means a user who set nothing.
    The result is always a subset of ``requested ∪ {"inbox"}``.
    """
    category = category_cfg.name
    wanted = _dedupe(c for c in (requested or category_cfg.default_channels) if c in CHANNELS)
    enabled = [c for c in wanted if switch_on(prefs, category, c)]
    usable = [c for c in enabled if is_reachable(c, prefs, has_device)]
    if usable:
        return usable, None
    if category_cfg.inbox_fallback and switch_on(prefs, category, "inbox"):
        return ["inbox"], None
    if wanted and not enabled:
        return [], OPTED_OUT
    return [], UNREACHABLE


def _dedupe(items: Iterable[str]) -> list[str]:
    return list(dict.fromkeys(items))
