"""The priority an event may ask for: at most its category's ``max_priority``
(``config/defaults.toml``; unset = the category's own ``priority``).

A producer chooses the lane of its events with ``"priority"``; without a cap, a
marketing campaign sent as ``"high"`` would run on the OTP lanes
(``notify.events.high``, ``notify.intents.high``, ``notify.send.*.high``) and
stand in front of every OTP. So a priority above the category's cap is
*lowered* to the cap (the API's answer says which priority the event got),
unless the caller may choose any: an API key with the ``priority:any`` scope.

The API marks an event it let through above its cap with the stream header
:data:`PRIORITY_ANY_HEADER`, so ``expand`` (which parses every event again, also
those written straight to ``notify.events``) keeps it; an event without the
mark is capped there too. The raw topics are a trusted door (a writer there can
write any topic, the intents and lanes included): the mark is the API's word,
not a secret.

Pure functions; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping  # (isinstance with typing's alias is a few Python calls)
from typing import Any, Iterable, Optional

__all__ = ["RANK", "PRIORITY_ANY_SCOPE", "PRIORITY_ANY_HEADER", "cap", "capped", "above_cap", "marked_any"]

#: higher is more urgent
RANK = {"low": 0, "normal": 1, "high": 2}
#: the API key scope that lets a producer choose any priority
PRIORITY_ANY_SCOPE = "priority:any"
#: the stream header the API writes with an event let through above its category's cap
PRIORITY_ANY_HEADER = ("priority", b"any")


def cap(category: Any) -> str:
    """The highest priority an event of ``category`` (a CategoryConfig) may ask for."""
    return getattr(category, "max_priority", None) or category.priority


def capped(category: Any, requested: Optional[str], *, any_allowed: bool = False) -> Optional[str]:
    """``requested`` lowered to the category's cap (None stays None: the category's
    own priority applies, never above its cap); unchanged when ``any_allowed``."""
    if requested is None or any_allowed:
        return requested
    top = cap(category)
    return top if RANK.get(requested, 0) > RANK.get(top, 0) else requested


def above_cap(category: Any, priority: Optional[str]) -> bool:
    """Whether ``priority`` is above what the category allows by default."""
    return priority is not None and RANK.get(priority, 0) > RANK.get(cap(category), 0)


def marked_any(headers: Optional[Iterable[Any]]) -> bool:
    """Whether a stream entry's headers carry :data:`PRIORITY_ANY_HEADER`."""
    name, value = PRIORITY_ANY_HEADER
    if isinstance(headers, Mapping):
        headers = headers.items()
    for item in headers or ():
        try:
            k, v = item
        except (TypeError, ValueError):
            continue
        if k == name and (v == value or v == value.decode()):
            return True
    return False
