"""bench/parts.py: each py-spy sample is given to the part of its innermost frame
that has one."""

from pathlib import Path

from bench.parts import by_part, part_lines, part_of

LOOP = "Worker.execute_from_commandline (mode/worker.py:264)"


def test_the_innermost_frame_with_a_part_names_it():
    emit = [LOOP, "Guard.plan_and_send (agents/guard.py:90)", "Emit.outcomes (agents/emit.py:60)"]
    assert part_of(emit + ["dumps (<direct_dumps Outcome>:8)"]) == "outcomes and entries encoded"
    assert part_of(emit) == "outcomes and entries encoded"
    assert part_of([LOOP, "Handoff.put (agents/handoff.py:70)", "Event.set (asyncio/locks.py:182)"]).startswith(
        "event loop")
    assert part_of([LOOP, "Handoff.put (agents/handoff.py:70)"]).startswith("lanes")
    assert part_of([LOOP]).startswith("event loop")
    assert part_of(["Thread._bootstrap (threading.py:995)", "_connection_worker_thread (aiosqlite/core.py:66)",
                    "run (pipeline/store/rows.py:80)"]).startswith("record store")
    assert part_of(["f (elsewhere.py:1)"]) == "other"


def test_samples_are_counted_by_part_and_priced(tmp_path: Path):
    raw = tmp_path / "w0.raw"
    raw.write_text(f"{LOOP};Guard.plan_and_send (agents/guard.py:90);_plan (pipeline/rules/plan.py:10) 3\n"
                   f"{LOOP} 1\n")
    parts, total = by_part([raw])
    assert total == 4 and parts["rules and plan"] == 3
    lines = part_lines([raw], worker_us=400.0)
    assert "| rules and plan | 75.0% | 300 |" in lines
