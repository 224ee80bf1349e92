"""pipeline.rules.states: the transition table, and merge as an order-free join."""

import itertools
import re

import pytest
from hypothesis import given, settings, strategies as st

from pipeline.models import State
from pipeline.rules import states
from pipeline.rules.states import can_transition, merge, merge_all

ALL = list(State.ALL)
any_state = st.sampled_from(ALL)
RETRY_MOVES = {
    (State.UNKNOWN, State.PENDING),
    (State.UNKNOWN, State.SCHEDULED),
    (State.SCHEDULED, State.PENDING),
}


def test_docstring_table_is_the_code():
    doc = states.__doc__
    table = doc[doc.index("old          → new") :].split("\n\n")[0].splitlines()[1:]
    parsed = {}
    for line in table:
        old, new = (part.strip() for part in line.split("→"))
        key = None if old == "(none)" else old
        parsed[key] = set() if new == "(terminal)" else {s.strip() for s in new.split(",")}
    assert parsed == {k: set(v) for k, v in states.TRANSITIONS.items()}


def test_precedence_covers_every_state_and_terminal_on_top():
    assert sorted(states.PRECEDENCE) == sorted(State.ALL)
    top = states.PRECEDENCE[len(states.IN_FLIGHT) :]
    assert set(top) == set(State.TERMINAL)
    assert re.search(r"PENDING < SCHEDULED < UNKNOWN", states.__doc__)


def test_table_rules():
    for s in ALL:
        assert can_transition(s, s), "replaying an outcome is always legal (a no-op)"
    for s in states.FINAL:
        assert {n for n in ALL if can_transition(s, n)} == {s}
    for s in State.TERMINAL:
        assert not can_transition(s, State.PENDING)
        assert not can_transition(s, State.SCHEDULED)
    for receipt in (State.DELIVERED, State.UNDELIVERED):
        assert {o for o in [None, *ALL] if can_transition(o, receipt)} == {State.ACCEPTED, receipt}
    assert not can_transition(State.PENDING, State.DELIVERED)
    assert not can_transition(None, State.DELIVERED)
    assert can_transition(State.UNKNOWN, State.ACCEPTED)  # reconciled
    assert can_transition(State.UNKNOWN, State.REVIEW)
    assert can_transition(State.UNKNOWN, State.FAILED)
    assert can_transition(State.UNKNOWN, State.PENDING)  # not received: retry
    assert can_transition(State.SCHEDULED, State.PENDING)  # due
    assert not can_transition(State.PENDING, State.REVIEW)
    assert not can_transition("SENT", State.ACCEPTED)
    assert not can_transition(State.PENDING, "BOUNCED")


def test_merge_agrees_with_the_table_except_retries():
    for old, new in itertools.product([None, *ALL], ALL):
        if not can_transition(old, new):
            continue
        expected = old if (old, new) in RETRY_MOVES else new
        assert merge(old, new) == expected, (old, new)


def test_merge_rejects_unknown_states():
    with pytest.raises(ValueError):
        merge(State.PENDING, "SENT")
    with pytest.raises(ValueError):
        merge(None, "nope")
    with pytest.raises(ValueError):
        merge("nope", State.PENDING)


@given(any_state, any_state, any_state)
def test_merge_is_a_join(a, b, c):
    assert merge(a, b) == merge(b, a)
    assert merge(merge(a, b), c) == merge(a, merge(b, c))
    assert merge(a, a) == a
    assert merge(None, a) == a
    assert merge(a, b) in (a, b)
    if a in State.TERMINAL:
        assert merge(a, b) in State.TERMINAL


@st.composite
def legal_history(draw):
    """A random walk through the transition table, from no record."""
    path, cur = [], None
    for _ in range(draw(st.integers(1, 12))):
        nxt = sorted(states.TRANSITIONS[cur] | ({cur} if cur else set()))
        if not nxt:
            break
        cur = draw(st.sampled_from(nxt))
        path.append(cur)
    return path


@settings(max_examples=300)
@given(legal_history(), st.data())
def test_any_permutation_with_duplicates_of_a_history(path, data):
    dups = data.draw(st.lists(st.sampled_from(path), max_size=len(path) * 2))
    seen = data.draw(st.permutations(path + dups))
    shown = merge_all(seen)

    assert shown == merge_all(path), "order does not matter"
    assert shown in path
    if any(s in State.TERMINAL for s in path):
        assert shown in State.TERMINAL, "never in flight again after a terminal outcome"
    if path[-1] in State.TERMINAL:
        assert shown == path[-1], "a finished history shows its final state"
    # replaying any part of it again changes nothing
    assert merge_all(seen + data.draw(st.permutations(seen)), start=shown) == shown
    for s in seen:
        assert merge(shown, s) == shown
