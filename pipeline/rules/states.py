"""The delivery state machine, and what a record shows when outcomes arrive.

Two questions, two functions (both pure):

``can_transition(old, new)``
    Is ``new`` a legal *next* state for a delivery now in ``old``, in one live
    history? Agents may assert it before they emit an outcome; the record sink
    may count the outcomes that break it (they are out of order or duplicated).

``merge(old, new)``
    What the record shows once it has seen both. Outcomes reach the sink
    replayed, duplicated and out of order (two topics, rebalances, a zombie
    worker, a receipt that overtakes the ACCEPTED outcome), so ``merge`` must
    not depend on arrival order: it is the maximum under a fixed precedence
    (a join: commutative, associative, idempotent), and folding any permutation
    of any outcomes, with any duplicates, gives the same state.

Transitions (``can_transition``; every state may also "move" to itself: a
replayed outcome is a no-op)::

    old          → new
    (none)       → PENDING, SCHEDULED, UNKNOWN, ACCEPTED, FILTERED, FAILED
    PENDING      → SCHEDULED, UNKNOWN, ACCEPTED, FILTERED, FAILED
    SCHEDULED    → PENDING, UNKNOWN, ACCEPTED, FILTERED, FAILED
    UNKNOWN      → PENDING, SCHEDULED, ACCEPTED, FAILED, REVIEW
    ACCEPTED     → DELIVERED, UNDELIVERED
    DELIVERED    → (terminal)
    UNDELIVERED  → (terminal)
    FILTERED     → (terminal)
    FAILED       → (terminal)
    REVIEW       → (terminal)

Notes on the table:

* A record may start in any state PENDING may move to (an agent need not emit
  PENDING first), but never in DELIVERED/UNDELIVERED/REVIEW.
* SCHEDULED (deferred by quiet hours or a delayed retry) goes back to PENDING
  when due, or straight to the result of the attempt made then.
* UNKNOWN (the provider timed out; it may or may not have the message) is
  reconciled: ACCEPTED if the provider has it, PENDING/SCHEDULED (a retry) if it
  has not, REVIEW when the reconcile budget runs out, FAILED on a permanent
  answer. FILTERED is not reachable from UNKNOWN directly: the retry passes
  through PENDING, where unsubscribe is re-checked.
* DELIVERED and UNDELIVERED come only from a receipt, hence only after
  ACCEPTED; never from PENDING directly.
* No terminal state ever goes back to PENDING or SCHEDULED.

Precedence (``merge``), lowest to highest::

    PENDING < SCHEDULED < UNKNOWN              (in flight)
            < FILTERED < FAILED < REVIEW       (our decision to stop)
            < ACCEPTED < UNDELIVERED < DELIVERED   (what the provider did)

* Every terminal state (``State.TERMINAL``: the last six) outranks every
  in-flight one, so once a terminal outcome was seen the record never shows an
  in-flight state again, whatever arrives after it.
* Evidence from the outside world outranks our own decisions: these pairs
  cannot both happen in one history, but they do meet at the sink (a duplicate
  delivery processed twice across a rebalance, a late receipt for an attempt we
  gave up on). If the provider took the message, the record says so rather than
  "filtered" or "failed"; a REVIEW resolved by a late acceptance leaves the
  review queue by itself.
* REVIEW outranks FAILED (a person keeps looking); DELIVERED outranks
  UNDELIVERED (carriers report interim failures before a final success).

``merge`` agrees with ``can_transition`` on every legal move except the three
retry moves (UNKNOWN → PENDING/SCHEDULED, SCHEDULED → PENDING): a retry and a
late duplicate of an earlier outcome carry the same state, so the record keeps
showing the higher state (UNKNOWN, SCHEDULED) until the retry ends. For a legal
history that ends in a terminal state, ``merge`` over any permutation of its
outcomes is exactly that final state.

A record with several deliveries (a push to each of the user's devices) shows
``of_deliveries`` of their states: ACCEPTED (or a receipt's DELIVERED /
UNDELIVERED) once a provider took it for one device; in flight while any device's
delivery is; FAILED (REVIEW, FILTERED) only when every device's delivery stopped
without a provider taking it. pipeline/store/devices.py applies it.
"""

from __future__ import annotations

from typing import Iterable, Optional

from ..models import State

__all__ = [
    "PRECEDENCE",
    "RANK",
    "IN_FLIGHT",
    "TERMINAL",
    "FINAL",
    "TRANSITIONS",
    "is_state",
    "is_terminal",
    "rank",
    "can_transition",
    "merge",
    "merge_all",
    "EVIDENCE",
    "of_deliveries",
]

#: merge order, lowest first
PRECEDENCE: tuple[str, ...] = (
    State.PENDING,
    State.SCHEDULED,
    State.UNKNOWN,
    State.FILTERED,
    State.FAILED,
    State.REVIEW,
    State.ACCEPTED,
    State.UNDELIVERED,
    State.DELIVERED,
)
RANK: dict[str, int] = {s: i for i, s in enumerate(PRECEDENCE)}

IN_FLIGHT: frozenset[str] = frozenset((State.PENDING, State.SCHEDULED, State.UNKNOWN))
#: the pipeline does no more work (ACCEPTED may still take a receipt)
TERMINAL: frozenset[str] = frozenset(State.TERMINAL)
#: no transition out at all
FINAL: frozenset[str] = frozenset(
    (State.DELIVERED, State.UNDELIVERED, State.FILTERED, State.FAILED, State.REVIEW)
)

_START = (
    State.PENDING, State.SCHEDULED, State.UNKNOWN, State.ACCEPTED, State.FILTERED, State.FAILED,
)  # fmt: skip

#: legal next states (self-moves excluded; they are always legal). ``None`` = no record yet.
TRANSITIONS: dict[Optional[str], frozenset[str]] = {
    None: frozenset(_START),
    State.PENDING: frozenset(
        (State.SCHEDULED, State.UNKNOWN, State.ACCEPTED, State.FILTERED, State.FAILED)
    ),
    State.SCHEDULED: frozenset(
        (State.PENDING, State.UNKNOWN, State.ACCEPTED, State.FILTERED, State.FAILED)
    ),
    State.UNKNOWN: frozenset(
        (State.PENDING, State.SCHEDULED, State.ACCEPTED, State.FAILED, State.REVIEW)
    ),
    State.ACCEPTED: frozenset((State.DELIVERED, State.UNDELIVERED)),
    State.DELIVERED: frozenset(),
    State.UNDELIVERED: frozenset(),
    State.FILTERED: frozenset(),
    State.FAILED: frozenset(),
    State.REVIEW: frozenset(),
}

assert set(PRECEDENCE) == set(State.ALL)
assert TERMINAL == frozenset(PRECEDENCE[len(IN_FLIGHT):])


def is_state(state: object) -> bool:
    return isinstance(state, str) and state in RANK


def is_terminal(state: Optional[str]) -> bool:
    return state in TERMINAL


def rank(state: str) -> int:
    """Position in :data:`PRECEDENCE`; ``ValueError`` for an unknown state."""
    try:
        return RANK[state]
    except (KeyError, TypeError):
        raise ValueError(f"unknown delivery state {state!r}") from None


def can_transition(old: Optional[str], new: str) -> bool:
    """Whether a delivery in ``old`` (``None``: no record yet) may move to ``new``."""
    if new not in RANK or (old is not None and old not in RANK):
        return False
    if old == new:
        return True
    return new in TRANSITIONS[old]


def merge(old_state: Optional[str], new_state: str) -> str:
    """The state a record shows after ``old_state`` and ``new_state`` (order-free)."""
    if old_state is None:
        rank(new_state)
        return new_state
    return new_state if rank(new_state) > rank(old_state) else old_state


def merge_all(states: Iterable[str], start: Optional[str] = None) -> Optional[str]:
    """Fold :func:`merge` over ``states``; ``start`` when there are none."""
    current = start
    for s in states:
        current = merge(current, s)
    return current


#: a provider took the message (it may or may not have reached the device yet)
EVIDENCE: frozenset[str] = frozenset((State.ACCEPTED, State.UNDELIVERED, State.DELIVERED))


def of_deliveries(states: Iterable[str], expected: int = 0) -> Optional[str]:
    """The state a record shows when it has several deliveries: a push goes to each of
    the user's devices, one delivery each (``states``: each delivery's own state, the
    :func:`merge` of its outcomes; ``expected``: how many deliveries the record has,
    as the outcomes say, so one whose first outcome has not arrived yet counts).

    * a provider took it for some device: the highest of those (DELIVERED if any
      device's receipt says so, else UNDELIVERED, else ACCEPTED): the user got it;
    * else, some delivery still in flight (or not seen yet): the highest in-flight
      state (UNKNOWN, SCHEDULED, PENDING): the record is not decided while one
      device may still get it;
    * else (every delivery stopped without a provider taking it): the highest of
      their states, REVIEW > FAILED > FILTERED: FAILED only if every device failed.

    Order-free, as :func:`merge` is, given the same deliveries' states; one delivery
    gives its own state. ``None`` for no deliveries."""
    states = list(states)
    if not states:
        return None
    best = merge_all(states)
    if best in EVIDENCE:
        return best
    flying = [s for s in states if s in IN_FLIGHT]
    if flying:
        return merge_all(flying)
    if len(states) < expected:
        return State.PENDING
    return best

