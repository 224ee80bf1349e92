"""Supervision (issue 26, item 2): `notify run` restarts a process that exits, with
backoff, counts crash loops, keeps the API and the broker up, and stops everything
only on a signal. The rules on real short-lived processes; the whole of it on
`notify run` with its embedded server, a worker killed with SIGKILL."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from pipeline.embedded import free_port
from pipeline.supervise import (BACKOFF_CAP_S, LOOP_RESTARTS, STABLE_S, Child, Supervisor, crash_looping,
                                restart_delay)
from tests.cli.test_cli import ROOT, notify
from tests.transport.helpers import wait_until


def test_restart_delay_doubles_to_its_cap():
    delays = [restart_delay(n) for n in range(1, 12)]
    assert delays[:4] == [0.5, 1.0, 2.0, 4.0]
    assert all(a <= b for a, b in zip(delays, delays[1:]))
    assert max(delays) == BACKOFF_CAP_S


def test_crash_loop_is_five_exits_within_the_window():
    assert not crash_looping([0, 10, 20, 30], now=40)
    assert crash_looping([0, 10, 20, 30, 40], now=40)
    assert not crash_looping([0, 10, 20, 30, 40], now=40 + 301)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _exits(code: int):
    return lambda: subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({code})"])


def test_supervisor_restarts_with_backoff_and_reports_a_crash_loop():
    clock, reports = Clock(), []
    crasher = Child("crasher", _exits(3))
    steady = Child("steady", lambda: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    sup = Supervisor([crasher, steady], report=reports.append, clock=clock)
    sup.start()
    try:
        for i in range(LOOP_RESTARTS):
            crasher.proc.wait(10)
            assert sup.tick()  # the exit is seen: a restart is scheduled, not done yet
            assert crasher.due_at == pytest.approx(clock.t + restart_delay(i + 1))
            assert not sup.tick()
            clock.t = crasher.due_at
            assert sup.tick() and crasher.restarts == i + 1
        state = sup.states()
        assert state["crasher"]["last_exit"] == 3 and state["crasher"]["crash_loop"]
        assert state["steady"]["up"] and state["steady"]["restarts"] == 0 and not state["steady"]["crash_loop"]
        assert reports[-1]["crasher"]["restarts"] == LOOP_RESTARTS
        # a run longer than STABLE_S forgets the failures: the backoff starts over
        crasher.proc.wait(10)
        clock.t += STABLE_S + 1
        sup.tick()
        assert crasher.due_at == pytest.approx(clock.t + restart_delay(1))
    finally:
        sup.stop(timeout=5)
    assert steady.proc.poll() is not None


def _children(pid: int) -> list:
    return psutil.Process(pid).children()


def test_notify_run_restarts_a_killed_worker_and_keeps_the_api_and_broker(tmp_path):
    env = dict(os.environ, NOTIFY_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=str(ROOT))
    env.pop("REDIS_URL", None)
    (tmp_path / "notify.toml").write_text("receipt_poll_s = 0\n")
    env["NOTIFY_CONFIG"] = str(tmp_path / "notify.toml")
    api_port = free_port()
    log = open(tmp_path / "run.log", "w")
    run = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", "--api-port", str(api_port),
                            "--metrics-port", "0", "--providers", "fake", "--workers", "1"],
                           cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        def processes() -> dict:
            out = notify(env, "status", check=False).stdout
            names = ("/main-0 ", "/priority ", "/api ", "/broker ")
            # the processes' rows (host/name first), not the breakers' (provider, then host/worker)
            rows = [line.split() for line in out.splitlines()
                    if any(n in line for n in names) and "/" in line.split()[0]]
            return {r[0].split("/", 1)[1]: r[1:] for r in rows}

        wait_until(lambda: (Path(env["NOTIFY_DATA_DIR"]) / "broker.url").exists(), 30, 0.1, "the broker")
        wait_until(lambda: set(processes()) == {"broker", "priority", "main-0", "api"}, 60, 0.3,
                   "the default layout")
        worker = next(p for p in _children(run.pid) if "--role main" in " ".join(p.cmdline()))
        api = next(p for p in _children(run.pid) if " api " in " ".join(p.cmdline()) + " ")
        worker.send_signal(signal.SIGKILL)
        wait_until(lambda: processes().get("main-0", [""])[0] == "up" and processes()["main-0"][2] == "1",
                   60, 0.3, "the worker restarted")
        state, pid, restarts, last_exit = processes()["main-0"]
        assert int(pid) != worker.pid and last_exit == "-9"
        assert api.is_running() and run.poll() is None
        # the restarted worker does the work
        notify(env, "send", "--category", "transaction", "--template", "order_shipped", "--to", "s1",
               "--param", "order_no=1", "--param", "carrier=UPS", "--param", "tracking_no=T",
               "--param", "tracking_url=https://t", "--biz-key", "sup:1")
        wait_until(lambda: "DELIVERED" in notify(env, "records", "show", "sup:1", check=False).stdout, 60, 0.5,
                   "the event delivered after the restart")
        # the API reports it too
        import urllib.request

        metrics = urllib.request.urlopen(f"http://127.0.0.1:{api_port}/metrics", timeout=10).read().decode()
        assert any(line.startswith("notify_process_restarts{") and "main-0" in line and line.endswith(" 1.0")
                   for line in metrics.splitlines()), metrics[-2000:]
        status = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{api_port}/v1/status.json", timeout=10).read())
        assert any(name.endswith("/main-0") and st["restarts"] == 1 for name, st in status["processes"].items())
        # every worker's breakers, not the API process's own (pipeline/breakers.py)
        assert any(w.endswith("/main-0") and b["state"] == "closed"
                   for workers in status["breakers"].values() for w, b in workers.items()), status["breakers"]
        assert "breaker" in notify(env, "status").stdout
    finally:
        kids = _children(run.pid) if run.poll() is None else []
        run.terminate()
        code = run.wait(60)
    assert code == 0, (tmp_path / "run.log").read_text()[-3000:]
    assert not [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE]
    assert "exited with -9; restarting" in (tmp_path / "run.log").read_text()


def test_a_restart_takes_its_dependents_along_without_counting_them_as_failures():
    clock = Clock()
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    sims = Child("simulators", lambda: subprocess.Popen(sleeper), restart_with=("main-0",))
    worker = Child("main-0", lambda: subprocess.Popen(sleeper))
    sup = Supervisor([sims, worker], clock=clock)
    sup.start()
    try:
        first = worker.proc
        sims.proc.kill()
        sims.proc.wait(10)
        sup.tick()
        clock.t = sims.due_at
        sup.tick()  # the simulators start again, the worker is asked to stop
        first.wait(10)
        sup.tick()  # its exit was planned: started again at once
        sup.tick()
        assert worker.proc is not first and worker.proc.poll() is None
        assert worker.restarts == 1 and not worker.exits and worker.consecutive == 0
        assert sims.restarts == 1 and len(sims.exits) == 1
    finally:
        sup.stop(timeout=5)
