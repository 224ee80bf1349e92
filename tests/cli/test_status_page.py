"""The status page renders live numbers in a real headless Chromium (Debian's
package, started by the test), with a screenshot."""

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from pipeline.embedded import free_port
from pipeline.procs import stop_process

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", "--virtual-time-budget=6000", "--window-size=1280,1000", *args],
        capture_output=True, text=True, timeout=90)


@pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed (apt-get install chromium)")
def test_status_page_renders_live_numbers(tmp_path):
    port = free_port()
    env = dict(os.environ, NOTIFY_DATA_DIR=str(tmp_path / "data"), PYTHONPATH=str(ROOT), NOTIFY_API_KEY="k-status")
    env.pop("REDIS_URL", None)
    (tmp_path / "notify.toml").write_text("receipt_poll_s = 0\n")
    env["NOTIFY_CONFIG"] = str(tmp_path / "notify.toml")
    run = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "run", "--providers", "fake", "--metrics-port", "0",
                            "--api-port", str(port)], cwd=str(ROOT), env=env,
                           stdout=open(tmp_path / "run.log", "w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 30
        while True:
            try:
                urllib.request.urlopen(base + "/healthz", timeout=1)
                break
            except OSError:
                assert time.time() < deadline, (tmp_path / "run.log").read_text()[-2000:]
                time.sleep(0.2)

        def post(body):
            req = urllib.request.Request(base + "/v1/events", data=json.dumps(body).encode(), method="POST",
                                         headers={"Authorization": "Bearer k-status", "Content-Type": "application/json"})
            try:
                return urllib.request.urlopen(req, timeout=10).status
            except urllib.error.HTTPError as e:
                return e.code

        for i in range(7):
            assert post({"biz_key": f"page:{i}", "category": "transaction", "template": "welcome",
                         "channels": ["inbox"], "recipients": [f"p{i}"], "params": {"url": "https://w"}}) == 202
        deadline = time.time() + 60
        while True:  # wait until the numbers are there
            status = json.loads(urllib.request.urlopen(base + "/v1/status.json", timeout=5).read())
            if "DELIVERED" in json.dumps(status) and "7" in json.dumps(status):
                break
            assert time.time() < deadline, status
            time.sleep(0.5)
        dom = chromium("--dump-dom", base + "/", profile=tmp_path / "chrome1").stdout
        assert "notify.events" in dom and "DELIVERED" in dom, dom[-3000:]
        assert '<span id="updated">never</span>' not in dom  # the script ran and filled the page
        shot = tmp_path / "status.png"
        chromium(f"--screenshot={shot}", base + "/", profile=tmp_path / "chrome2")
        data = shot.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    finally:
        stop_process(run, 60)
