"""A Redis Cluster of three masters on 127.0.0.1, for tests (tests/transport/test_cluster.py,
tests/cli/test_cluster_cli.py).

The cluster is built without redis-cli: slot ranges with CLUSTER ADDSLOTSRANGE on
each node, CLUSTER MEET between them, then wait for ``cluster_state:ok``.  With
``password`` every node asks clients for it (``requirepass``); the cluster bus
needs none.
"""

from typing import Optional

import pytest
import redis

from pipeline.embedded import EmbeddedRedis, free_port

from .helpers import wait_until

RANGES = [(0, 5460), (5461, 10922), (10923, 16383)]


def free_ports(n: int) -> list[int]:
    ports: list[int] = []
    while len(ports) < n:
        p = free_port()
        if p not in ports:
            ports.append(p)
    return ports


class Cluster:
    def __init__(self, base, password: Optional[str] = None) -> None:
        self.base = base
        self.password = password
        self.nodes: list[EmbeddedRedis] = []

    @property
    def url(self) -> str:
        """The URL of the first node (a single seed)."""
        return self.nodes[0].url

    @property
    def seeds_url(self) -> str:
        """``redis://[:pw@]h1:p1,h2:p2,h3:p3/0``: every node a seed."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes) + "/0"

    def client(self, node: int) -> redis.Redis:
        return redis.Redis(port=self.nodes[node].port, password=self.password)

    def start(self, timeout: float = 20.0) -> "Cluster":
        ports = free_ports(6)
        for port, bus in zip(ports[:3], ports[3:]):
            node = EmbeddedRedis(
                self.base / f"n{port}",
                port,
                extra=(
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-port", str(bus),
                    "--cluster-node-timeout", "5000",
                ),
                password=self.password,
            )
            self.nodes.append(node)
            try:
                node.start()
            except RuntimeError as exc:
                pytest.skip(f"valkey-server refuses cluster mode: {exc}")
        clients = [self.client(i) for i in range(len(self.nodes))]
        try:
            for r, (lo, hi) in zip(clients, RANGES):
                r.execute_command("CLUSTER ADDSLOTSRANGE", lo, hi)
            for r in clients[1:]:
                r.execute_command("CLUSTER MEET", "127.0.0.1", self.nodes[0].port, ports[3])
        except redis.ResponseError as exc:
            pytest.skip(f"valkey-server refuses cluster mode: {exc}")

        def ready() -> bool:
            for r in clients:
                if r.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                    return False
                if len(r.execute_command("CLUSTER SLOTS")) != 3:
                    return False
            return True

        wait_until(ready, timeout, 0.05, "cluster_state:ok on all three nodes")
        for r in clients:
            r.close()
        return self

    def flush(self) -> None:
        for i in range(len(self.nodes)):
            with self.client(i) as r:
                r.flushall()

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
