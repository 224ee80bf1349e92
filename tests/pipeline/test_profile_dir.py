"""NOTIFY_PROFILE_DIR (config/environment.py; bench/real.py --calls): a worker runs
under cProfile and writes its profile when it stops; a directory it cannot write
to is refused at start, naming the variable, before the worker takes any work."""

import pstats

from .harness import Pipeline


def test_a_worker_writes_its_profile_when_it_stops(redis_url, tmp_path):
    prof_dir = tmp_path / "profiles"
    pipe = Pipeline(redis_url, tmp_path, NOTIFY_PROFILE_DIR=prof_dir)
    pipe.preferences([{"user_id": "pf1", "phone": "+15550301234", "version": 1}])
    pipe.start("w")
    try:
        pipe.events([{"biz_key": "otp:pf1", "category": "otp", "template": "otp", "channels": ["sms"],
                      "recipients": ["pf1"], "params": {"code": "123456"}}])
        pipe.wait_rows(lambda r: r.get(("otp:pf1", "pf1", "sms"), {}).get("status") == "ACCEPTED", 90, "the OTP sent")
    finally:
        pipe.stop()
    [prof] = prof_dir.glob(f"worker-all-{pipe.procs[0].pid}.prof")
    stats = pstats.Stats(str(prof))
    # the worker's own code ran under the profiler: the expand agent's function is in it
    assert stats.total_calls > 0
    assert any(f.endswith("agents/expand.py") and name == "expand_one" for f, _l, name in stats.stats)


def test_a_profile_dir_it_cannot_write_to_is_refused_at_start(redis_url, tmp_path):
    (tmp_path / "a-file").write_text("")
    pipe = Pipeline(redis_url, tmp_path, NOTIFY_PROFILE_DIR=tmp_path / "a-file" / "profiles")
    proc = pipe.start("w")
    try:
        assert proc.wait(60) != 0
    finally:
        pipe.stop()
    log = pipe.log("w")
    assert f"NOTIFY_PROFILE_DIR={tmp_path / 'a-file' / 'profiles'}" in log, log[-2000:]
    assert "Traceback" not in log
