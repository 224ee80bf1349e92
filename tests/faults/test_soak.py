"""Soak, short (issue 6, "Load"): bench/soak.py for ~20 s at a low rate on the real
pipeline (two worker processes, embedded server with AOF everysec, fake providers),
with short windows so purges and compactions happen within the run.

    python -m pytest tests/faults/test_soak.py -q
    python bench/soak.py --minutes 10 --rate 300     # the full soak → bench/RESULTS.md

One run (module fixture), two checks: nothing is lost, and the streams are bounded:
changelogs after compaction (tombstones past their grace dropped), topics trimmed
below the committed offsets.
"""

import pytest

from bench import soak

pytestmark = [pytest.mark.faults, pytest.mark.slow]

WINDOW_S, PURGE_S, COMPACT_S, KEEP_S = 4.0, 2.0, 4.0, 4.0
PARTITIONS = 4


@pytest.fixture(scope="module")
def soaked():
    return soak.run(
        20 / 60, 40, workers=2, n_users=500, partitions=PARTITIONS, sample_s=2.0, compact_s=COMPACT_S,
        dedup_window_s=WINDOW_S, purge_s=PURGE_S, inflight_keep_s=KEEP_S, tombstone_s=KEEP_S, keep_s=KEEP_S,
        drain_timeout=30, settle_s=WINDOW_S + PURGE_S + KEEP_S + 2 * COMPACT_S + 3, tag="soak-test", log=print,
    )


def test_soak_loses_nothing(soaked):
    res = soaked
    print(soak.report(res, 1.0))
    assert not res.worker_exits, res.worker_exits
    assert res.fed >= 700, f"only {res.fed} events fed"
    assert res.drained, "lag did not reach zero (or the record store did not settle) after the feed stopped"
    assert res.samples[-1].lag == 0
    assert res.missing == 0, f"{res.missing} (biz_key, recipient) pairs without a record: {res.missing_examples}"
    assert res.pending == 0, f"{res.pending} records still PENDING"
    assert res.dlq == 0, f"{res.dlq} dead letters"


def test_soak_changelogs_bounded_after_compaction(soaked):
    """Once every dedup key and inflight mark has expired, been purged (a tombstone)
    and a compaction has run, those changelogs hold what is live (nothing) plus at
    most a tail entry per partition; the daily counters (in the dedup table) at
    most one entry per (user, category, day), the users' tables one per user. Not: every key ever written."""
    res = soaked
    peak = {t: max(s.per_table.get(t, (0, 0))[0] for s in res.samples) for t in soak.TABLES}
    final = res.final_changelog
    print(f"changelog peaks {peak}, after expiry + compaction {final}, tombstones {res.final_tombstones}")
    # a commit's dedup changes of a partition are one group entry (pipeline/transport/groups.py):
    # ~800 events make a few hundred entries, ten times the bound below
    assert peak["dedup"] > 10 * PARTITIONS, "too little written to tell"
    bounds = {
        # the daily counters live in the dedup table (agents/guard.py): live for two days,
        # their group entries with them; the dedup entries themselves are purged
        "dedup": res.users * 3 + PARTITIONS,
        "inflight": PARTITIONS,
        "timers": PARTITIONS + 50,  # retries in flight at most
        "daily": res.users * 3 + PARTITIONS,  # (user, category, day), categories fed: 3
        "preferences": res.users + PARTITIONS,
        "devices": res.users + PARTITIONS,
    }
    over = {t: (final.get(t, 0), b) for t, b in bounds.items() if final.get(t, 0) > b}
    assert not over, f"changelog entries (after compaction, bound): {over}; peaks {peak}"
    # every topic was consumed and committed, and is older than the keep window: trimmed
    assert res.final_topics <= 10, f"{res.final_topics} entries left in the topic streams"
