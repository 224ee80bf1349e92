"""A preferences update applied to the user's current preferences, and the
opt-outs it makes (the users agent, agents/users.py). Pure: no I/O.

Two kinds of update come on ``notify.preferences``:

* a whole document (``merge`` false: the API's PUT, a producer writing the
  topic): it replaces the current one unless its version is lower (an equal
  version is taken, as before: producers that never set one keep working);
* a merge (``merge`` true: a one-click unsubscribe, a provider's spam complaint
  or unsubscribe event; whoever sends it does not know the whole document): only
  its ``switches`` are set over the current ones, everything else is kept, and
  it is taken whatever its version (the user's latest word on that switch
  wins); the version becomes ``max(current, update)``, never more, so the next
  whole document of a producer that counts versions is not refused for it.

An update that changes nothing (stale, or a merge whose switches are already
so) gives None: nothing is written, nothing is recorded.

The opt-outs: every ``(category, channel)`` switch the new preferences turn off
compared with the *current table value* (:func:`tracking.switched_off`; ``*``
for a wildcard). Compared with the table, not with the update's sender's idea
of it, so a replayed update (applied already) records nothing.
"""

from __future__ import annotations

from typing import Any, Optional

from pipeline.models import Preferences

from .tracking import switched_off

__all__ = ["apply_update", "opt_outs"]


def apply_update(current: Optional[Preferences], update: Preferences) -> Optional[Preferences]:
    """The user's preferences after ``update``, or None when it changes nothing."""
    if not update.merge:
        if current is not None and update.version < current.version:
            return None  # stale: a newer document is in place
        return update
    base = dict(current.switches or {}) if current is not None else {}
    switches = {**base, **(update.switches or {})}
    if current is not None and switches == (current.switches or {}):
        return None
    fields: dict[str, Any] = current.asdict() if current is not None else {"user_id": update.user_id}
    fields.update(switches=switches, version=max(update.version, current.version if current is not None else 0),
                  source=update.source, producer=update.producer, merge=False)
    return Preferences(**fields)


def opt_outs(current: Optional[Preferences], new: Preferences) -> list[tuple[str, str]]:
    """The ``(category, channel)`` switches ``new`` turns off that ``current`` had on."""
    return switched_off(current.switches if current is not None else None, new.switches or {})
