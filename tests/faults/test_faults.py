"""The fault suite (issue 6): each test runs one drill of tests/faults/scenarios.py on
the real pipeline (worker processes, a server of its own, the provider simulators in
a process of their own with a call ledger) and checks the records against the
reference model and the provider calls against the ledger.

    python -m pytest tests/faults -q                   # short sizes, a few minutes
    python -m pytest tests/faults -m "faults and not slow"
    NOTIFY_FAULT_FULL=1 python -m pytest tests/faults  # the issue's sizes (50,000 events, 60 s down)
    python -m tests.faults.report                      # the same drills → docs/RELIABILITY.md
"""

import pytest

from . import scenarios

pytestmark = pytest.mark.faults


KNOWN = scenarios.KNOWN_BUGS  # failing because of a reported transport bug: xfail while it remains


def check(res: scenarios.Result) -> None:
    print(res.summary())
    if res.skipped:
        pytest.skip(res.skipped)
    failed = [c for c in res.failed() if c not in KNOWN]
    assert not failed, f"failed: {failed}\nproblems: {res.problems}\nfigures: {res.figures}"
    known = [c for c in res.failed() if c in KNOWN]
    if known:
        pytest.xfail(f"known transport bug: {known}: {res.problems[-1500:]}")


@pytest.mark.slow
def test_kill9_three_times_during_the_run(tmp_path):
    check(scenarios.kill9(tmp_path))


def test_sigstop_past_the_lease_then_sigcont_the_zombie_does_not_write(tmp_path):
    check(scenarios.sigstop(tmp_path))


def test_redis_killed_and_restarted_from_its_aof(tmp_path):
    check(scenarios.redis_restart(tmp_path))


@pytest.mark.slow
def test_provider_down_slow_and_accept_then_timeout(tmp_path):
    check(scenarios.providers(tmp_path))


def test_the_sinks_disk_failing_for_a_while(tmp_path):
    check(scenarios.sink_disk(tmp_path))


def test_clock_jumps_across_midnight_and_quiet_hours(tmp_path):
    check(scenarios.clock_jumps(tmp_path))
