"""Where the ports of our servers are picked (pipeline/embedded.py ``free_port``):
below the kernel's ephemeral range, or in ``NOTIFY_FREE_PORTS``, never a bound one."""

import socket

import pytest

from config.environment import EnvError, outside_ephemeral, port_range, read_env
from pipeline.embedded import free_port


def test_the_default_range_stays_below_the_ports_outgoing_connections_take():
    lo, hi = port_range(read_env({}))
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        ephemeral_lo = int(f.read().split()[0])
    assert 1024 < lo < hi < ephemeral_lo


def test_a_kernel_lending_the_low_ports_out_leaves_those_above_its_range():
    assert outside_ephemeral(32768, 60999) == (10000, 32767)
    assert outside_ephemeral(1024, 50000) == (50001, 65535)
    assert outside_ephemeral(1024, 65000) == (10000, 65535)  # no thousand ports clear of it: all of them


def test_a_stretch_of_its_own_is_kept_and_a_bound_port_passed_over(monkeypatch):
    with socket.socket() as taken:
        busy = free_port()  # in this test worker's stretch, below the ephemeral range
        taken.bind(("127.0.0.1", busy))
        monkeypatch.setenv("NOTIFY_FREE_PORTS", f"{busy - 2}-{busy + 2}")
        got = {free_port() for _ in range(8)}
    assert busy not in got
    assert got <= set(range(busy - 2, busy + 3))


@pytest.mark.parametrize("bad", ["20000", "30000-20000", "a-b", "0-100", "100-70000"])
def test_a_range_that_is_not_one_is_refused_with_the_variable_named(bad):
    with pytest.raises(EnvError, match="NOTIFY_FREE_PORTS"):
        read_env({"NOTIFY_FREE_PORTS": bad})
