"""``notify keys add`` and ``notify api`` as subprocesses against the test's
real server: the key printed once authenticates against the served API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from pipeline.embedded import free_port
from pipeline.procs import stop_process

ROOT = Path(__file__).resolve().parents[2]


def _http(method: str, url: str, key: str | None = None, body: dict | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None)
    if key:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_keys_add_then_api_serves(redis_url, tmp_path):
    env = dict(os.environ, NOTIFY_BROKER=redis_url, NOTIFY_DATA_DIR=str(tmp_path / "data"),
               NOTIFY_DB=str(tmp_path / "records.db"), NOTIFY_PARTITIONS="4", PYTHONPATH=str(ROOT))
    env.pop("NOTIFY_API_KEY", None)
    cli = [sys.executable, "-m", "pipeline.cli"]
    out = subprocess.run(cli + ["keys", "add", "shop", "--scopes", "events:write"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    key = json.loads(out.stdout)["key"]
    bad = subprocess.run(cli + ["keys", "add", "shop", "--scopes", "events:delete"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown scope" in bad.stderr and "Traceback" not in bad.stderr
    assert (tmp_path / "data" / "api_keys.json").exists()

    port = free_port()
    log = open(tmp_path / "api.log", "wb")
    proc = subprocess.Popen(cli + ["api", "--port", str(port)], env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = _http("GET", base + "/healthz")
                if status == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "api.log").read_text()
            assert time.monotonic() < deadline, "API did not come up"
            time.sleep(0.1)
        event = {"biz_key": "cli:1", "category": "otp", "template": "otp", "recipients": ["u1"], "params": {"code": "1"}}
        assert _http("POST", base + "/v1/events", None, event)[0] == 401
        status, body = _http("POST", base + "/v1/events", key, event)
        assert status == 202 and body["notifications"][0]["user_id"] == "u1"
        assert _http("GET", base + "/v1/notifications", key)[0] == 403  # events:write only
    finally:
        stop_process(proc, 15)
        log.close()
