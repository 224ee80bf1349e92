"""The worker's and the API's event loop (pipeline/lean.py use_fast_loop): uvloop by
default, asyncio's with NOTIFY_LOOP=asyncio. In a child process, since it sets
the process's loop policy."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = (
    "import asyncio\n"
    "from config.environment import read_env\n"
    "from pipeline.lean import use_fast_loop\n"
    "print(use_fast_loop(read_env().loop))\n"
    "async def main():\n"
    "    print(type(asyncio.get_running_loop()).__module__)\n"
    "asyncio.run(main())\n"
)


def _probe(loop: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "NOTIFY_LOOP"}
    if loop:
        env["NOTIFY_LOOP"] = loop
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return out.split()


def test_uvloop_by_default():
    pytest.importorskip("uvloop")
    name, module = _probe(None)
    assert name == "uvloop" and module.startswith("uvloop")


def test_asyncio_loop_on_request():
    assert _probe("asyncio") == ["asyncio", "asyncio.unix_events"]
