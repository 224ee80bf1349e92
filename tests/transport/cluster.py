"""A Redis Cluster of three masters on 127.0.0.1, for tests (tests/transport/test_cluster.py,
tests/cli/test_cluster_cli.py), optionally with one replica per master
(tests/transport/test_cluster_failover.py).

The cluster is built without redis-cli: slot ranges with CLUSTER ADDSLOTSRANGE on
each master, CLUSTER MEET between the nodes, then wait for ``cluster_state:ok``.
With ``replicas=True`` a replica per master joins too (CLUSTER REPLICATE
<master-id> once it knows the master), and :meth:`Cluster.start` waits until each
replica is in sync (``master_link_status:up``). :meth:`Cluster.kill_master` kills a
master with SIGKILL and waits until its replica is promoted and the cluster is
``ok`` again. With ``password`` every node asks clients for it (``requirepass``;
a replica's ``masterauth`` is set with CONFIG SET, never on the command line); the
cluster bus needs none.
"""

import time
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
    """``nodes[0:3]`` are the masters as started; with ``replicas``, ``nodes[3 + i]``
    replicates ``nodes[i]`` (until a failover swaps their roles)."""

    def __init__(self, base, password: Optional[str] = None, *, replicas: bool = False,
                 node_timeout_ms: int = 5000) -> None:
        self.base = base
        self.password = password
        self.replicas = replicas
        self.node_timeout_ms = node_timeout_ms
        self.nodes: list[EmbeddedRedis] = []
        self.ids: list[str] = []  # CLUSTER MYID of each node

    @property
    def url(self) -> str:
        """The URL of the first node (a single seed)."""
        return self.nodes[0].url

    @property
    def seeds_url(self) -> str:
        """``redis://[:pw@]h1:p1,h2:p2,h3:p3/0``: every master a seed."""
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:3]) + "/0"

    def client(self, node: int) -> redis.Redis:
        return redis.Redis(port=self.nodes[node].port, password=self.password)

    def alive(self, node: int) -> bool:
        proc = self.nodes[node].proc
        return proc is not None and proc.poll() is None

    def start(self, timeout: float = 20.0) -> "Cluster":
        n = 6 if self.replicas else 3
        ports = free_ports(2 * n)
        for port, bus in zip(ports[:n], ports[n:]):
            node = EmbeddedRedis(
                self.base / f"n{port}",
                port,
                extra=(
                    "--cluster-enabled", "yes",
                    "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-port", str(bus),
                    "--cluster-node-timeout", str(self.node_timeout_ms),
                ),
                password=self.password,
            )
            self.nodes.append(node)
            try:
                node.start()
            except RuntimeError as exc:
                pytest.skip(f"valkey-server refuses cluster mode: {exc}")
        clients = [self.client(i) for i in range(n)]
        try:
            self.ids = [r.execute_command("CLUSTER MYID").decode() for r in clients]
            for r, (lo, hi) in zip(clients, RANGES):
                r.execute_command("CLUSTER ADDSLOTSRANGE", lo, hi)
            for r in clients[1:]:
                r.execute_command("CLUSTER MEET", "127.0.0.1", self.nodes[0].port, ports[n])
        except redis.ResponseError as exc:
            pytest.skip(f"valkey-server refuses cluster mode: {exc}")

        if self.replicas:
            for i, r in enumerate(clients[3:]):
                if self.password:
                    r.config_set("masterauth", self.password)
                # a replica can REPLICATE only a master it knows (gossip brings it)
                wait_until(lambda: self.ids[i] in str(r.execute_command("CLUSTER NODES")), timeout, 0.05,
                           f"node {i + 3} knows master {i}")
                r.execute_command("CLUSTER REPLICATE", self.ids[i])

        def ready() -> bool:
            for r in clients:
                if r.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                    return False
                if len(r.execute_command("CLUSTER SLOTS")) != 3:
                    return False
            for r in clients[3:]:
                info = r.info("replication")
                if info.get("role") != "slave" or info.get("master_link_status") != "up" \
                        or info.get("master_sync_in_progress") not in (0, "0"):
                    return False
            for r in clients[:3 if self.replicas else 0]:
                if r.info("replication").get("connected_slaves") != 1:
                    return False
            return True

        what = "cluster_state:ok on all nodes" + (", every replica in sync" if self.replicas else "")
        wait_until(ready, timeout, 0.05, what)
        for r in clients:
            r.close()
        return self

    def masters(self) -> list[int]:
        """The indexes of the live nodes that are masters now."""
        out = []
        for i in range(len(self.nodes)):
            if not self.alive(i):
                continue
            with self.client(i) as r:
                if r.info("replication").get("role") == "master":
                    out.append(i)
        return out

    def node_of_key(self, key: str | bytes) -> int:
        """The index of the live master serving ``key``'s slot now."""
        live = next(i for i in range(len(self.nodes)) if self.alive(i))
        with self.client(live) as r:
            slot = r.execute_command("CLUSTER KEYSLOT", key)
            for lo, hi, master, *_ in r.execute_command("CLUSTER SLOTS"):
                if lo <= slot <= hi:
                    port = master[1]
                    return next(i for i, n in enumerate(self.nodes) if n.port == port)
        raise LookupError(key)

    def replica_of(self, master: int) -> int:
        """The live node replicating ``master`` (by node id)."""
        for i in range(len(self.nodes)):
            if i != master and self.alive(i):
                with self.client(i) as r:
                    info = r.info("replication")
                    if info.get("role") == "slave" and info.get("master_port") == self.nodes[master].port:
                        return i
        raise LookupError(f"no replica of node {master}")

    def kill_master(self, master: int, timeout: float = 60.0) -> tuple[int, float]:
        """kill -9 of the master ``nodes[master]``; wait until its replica is a
        master serving its slots and every live node says ``cluster_state:ok``.
        Returns (the promoted node's index, the seconds from the kill to then)."""
        replica = self.replica_of(master)
        dead_port = self.nodes[master].port
        t0 = time.monotonic()
        self.nodes[master].kill()  # SIGKILL

        def promoted() -> bool:
            try:
                live = [i for i in range(len(self.nodes)) if self.alive(i)]
                for i in live:
                    with self.client(i) as r:
                        if r.execute_command("CLUSTER INFO").get("cluster_state") != "ok":
                            return False
                        if any(m[1] == dead_port for _lo, _hi, m, *_ in r.execute_command("CLUSTER SLOTS")):
                            return False
                with self.client(replica) as r:
                    return r.info("replication").get("role") == "master"
            except redis.RedisError:
                return False

        wait_until(promoted, timeout, 0.05, f"node {replica} promoted in place of node {master}")
        return replica, time.monotonic() - t0

    def flush(self) -> None:
        for i in self.masters():
            with self.client(i) as r:
                r.flushall()

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()
