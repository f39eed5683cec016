"""Real ``redis-server`` processes for tests: standalone and a 3-master Cluster.

Every server binds a free loopback port, keeps no data on disk and is killed
when the test is done; tests never touch the machine's own Redis on 6379.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.net import free_port, wait_for_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"
REDIS_CLI = shutil.which("redis-cli") or "/usr/bin/redis-cli"


def _command(port: int, *args: str, timeout: float = 30.0) -> str:
    """Run one command with redis-cli and return its output."""
    result = subprocess.run(
        [REDIS_CLI, "-h", "127.0.0.1", "-p", str(port), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    return result.stdout


class RedisServer:
    """One standalone ``redis-server`` that can be killed and restarted on its port."""

    def __init__(self, port: int | None = None, *, extra_args: tuple[str, ...] = ()) -> None:
        self.port = port or free_port()
        self._dir = Path(tempfile.mkdtemp(prefix="rl-redis-"))
        self._extra = extra_args
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self._proc = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--save", "",
                "--appendonly", "no",
                "--dir", str(self._dir),
                *self._extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for_port(self.port)
        return self

    def kill(self) -> None:
        """SIGKILL, as a crash would; the port is free again afterwards."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(10)
            self._proc = None

    def command(self, *args: str) -> str:
        return _command(self.port, *args)

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """SIGSTOP the server, as a wedged server or a dead host (no RST)
        behaves: it keeps its sockets (the kernel still accepts TCP connections
        into its backlog and buffers what is written) but answers nothing
        until SIGCONT."""
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self._proc.pid, signal.SIGCONT)

    def close(self) -> None:
        self.kill()
        shutil.rmtree(self._dir, ignore_errors=True)


@contextlib.contextmanager
def redis_server(*, extra_args: tuple[str, ...] = ()) -> Iterator[RedisServer]:
    server = RedisServer(extra_args=extra_args).start()
    try:
        yield server
    finally:
        server.close()


def _cluster_ports(count: int) -> list[int]:
    # A cluster node also listens on port+10000 (the bus): pick ports whose bus port is free.
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port + 10000 > 65535 or port in ports:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        ports.append(port)
    return ports


class RedisClusterNodes:
    """A 3-master Redis Cluster (no replicas) on loopback."""

    def __init__(self, masters: int = 3) -> None:
        self.ports = _cluster_ports(masters)
        self._dir = Path(tempfile.mkdtemp(prefix="rl-redis-cluster-"))
        self._procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def start(self) -> RedisClusterNodes:
        for port in self.ports:
            node_dir = self._dir / str(port)
            node_dir.mkdir()
            proc = subprocess.Popen(
                [
                    REDIS_SERVER,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    str(node_dir / "nodes.conf"),
                    "--cluster-node-timeout",
                    "2000",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(node_dir),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self._procs.append(proc)
        for port in self.ports:
            wait_for_port(port)
        # Slots and introductions by hand, not ``redis-cli --cluster create``: its
        # own wait for the nodes to agree hung past 90 s on a loaded machine, and
        # could not be given a longer deadline. Here the wait is ours.
        share = 16384 // len(self.ports)
        for i, port in enumerate(self.ports):
            last = 16383 if i == len(self.ports) - 1 else (i + 1) * share - 1
            _command(port, "cluster", "addslotsrange", str(i * share), str(last))
        for port in self.ports[1:]:
            _command(self.ports[0], "cluster", "meet", "127.0.0.1", str(port))
        known = f"cluster_known_nodes:{len(self.ports)}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            infos = [_command(p, "cluster", "info") for p in self.ports]
            if all("cluster_state:ok" in info and known in info for info in infos):
                return self
            time.sleep(0.1)
        raise TimeoutError("the Redis Cluster did not reach cluster_state:ok")

    def command(self, port: int, *args: str) -> str:
        return _command(port, *args)

    def close(self) -> None:
        for proc in self._procs:
            proc.kill()
        for proc in self._procs:
            proc.wait(10)
        self._procs.clear()
        shutil.rmtree(self._dir, ignore_errors=True)


@contextlib.contextmanager
def redis_cluster(masters: int = 3) -> Iterator[RedisClusterNodes]:
    cluster = RedisClusterNodes(masters)
    try:
        yield cluster.start()
    finally:
        cluster.close()


class RedisSentinel:
    """One ``redis-server --sentinel`` monitoring a master as ``master_name`` (quorum 1)."""

    def __init__(self, master_port: int, master_name: str = "mymaster") -> None:
        self.port = free_port()
        self.master_name = master_name
        self._dir = Path(tempfile.mkdtemp(prefix="rl-sentinel-"))
        self._conf = self._dir / "sentinel.conf"
        self._conf.write_text(
            f"port {self.port}\nbind 127.0.0.1\ndir {self._dir}\n"
            f"sentinel monitor {master_name} 127.0.0.1 {master_port} 1\n"
            f"sentinel down-after-milliseconds {master_name} 5000\n"
        )
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisSentinel:
        self._proc = subprocess.Popen(
            [REDIS_SERVER, str(self._conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(self.port)
        return self

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait(10)
            self._proc = None
        shutil.rmtree(self._dir, ignore_errors=True)
