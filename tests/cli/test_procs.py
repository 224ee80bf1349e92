"""Child processes written once (pipeline/procs.py): SIGTERM then SIGKILL, and a
spawned worker's environment."""

import subprocess
import sys
import time

from pipeline.procs import stop_all, stop_process, worker_env

STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(60)"


def _spawn(code: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    if "ready" in code:
        assert p.stdout.readline().strip() == "ready"  # its SIGTERM handler is set
    return p


def test_sigterm_then_kill_within_the_timeout_in_all():
    polite = _spawn("import time; time.sleep(60)")
    stubborn = [_spawn(STUBBORN) for _ in range(2)]
    seen = []
    t0 = time.monotonic()
    hung = stop_all([polite, None, *stubborn], timeout=1.0, on_hung=seen.append)
    assert time.monotonic() - t0 < 5  # one timeout for all of them, not one each
    assert hung == seen == stubborn
    assert polite.returncode == -15 and all(p.returncode == -9 for p in stubborn)
    assert stop_process(polite, 1.0) is False  # already gone: nothing to do, no error


def test_stop_process_says_whether_it_killed():
    assert stop_process(_spawn("import time; time.sleep(60)"), 5.0) is False
    assert stop_process(_spawn(STUBBORN), 0.5) is True


def test_worker_env():
    base = {"PATH": "/bin", "NOTIFY_ROLE": "all"}
    env = worker_env(base, "redis://h:1/0", workers=2, index=1, NOTIFY_LEASE=3, NOTIFY_CONFIG=None)
    assert env == {"PATH": "/bin", "NOTIFY_ROLE": "all", "NOTIFY_BROKER": "redis://h:1/0", "NOTIFY_WORKERS": "2",
                   "NOTIFY_WORKER_INDEX": "1", "NOTIFY_LEASE": "3"}
    assert worker_env(env, role="priority", workers=1, index=0) == dict(
        env, NOTIFY_ROLE="priority", NOTIFY_WORKERS="1", NOTIFY_WORKER_INDEX="0")
    assert base == {"PATH": "/bin", "NOTIFY_ROLE": "all"}  # a copy
