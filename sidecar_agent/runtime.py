"""The running agent: two gRPC servers on Unix sockets, the certificate keeper, Envoy.

:class:`Agent` wires the parts (:mod:`sidecar_agent.sds`,
:mod:`sidecar_agent.relay`, :mod:`sidecar_agent.certificates`) to one
channel to mgmt-api, writes Envoy's bootstrap
(:func:`meshplane.sidecar_contract.bootstrap`: pipes only, no token) and
runs Envoy as a child. SIGTERM (or Envoy's exit) drains: Envoy first (it
finishes its requests), then the servers, then the sockets are removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.secret.v3 import sds_pb2_grpc

from meshplane import gateway_contract
from meshplane import sidecar_contract as sc
from meshplane.control_plane import ClientTlsFiles, Target
from meshplane.envoy_binary import envoy_path
from meshplane.parent_death import tied_command
from sidecar_agent.certificates import CertificateKeeper, KeeperMetrics, grpc_signer
from sidecar_agent.identity import MAX_TOKEN_BYTES
from sidecar_agent.relay import MAX_MESSAGE_BYTES, AdsRelay, read_token
from sidecar_agent.sds import MAX_REQUEST_BYTES, SdsServicer, SecretState

log = logging.getLogger("sidecar_agent")

#: How long Envoy gets to drain on SIGTERM before it is killed.
ENVOY_STOP_SECONDS = 20.0


_KEEPALIVE = [("grpc.keepalive_time_ms", 30_000), ("grpc.keepalive_timeout_ms", 10_000)]
#: How long the channel to mgmt-api waits, at most, between attempts to reconnect
#: (gRPC's default grows to 120 s). Relayed ADS streams wait for the channel
#: (sidecar_agent.relay), so this bounds how long after mgmt-api is back a pod's
#: Envoy hears from it: within Envoy's own 30 s backoff, and much sooner.
RECONNECT_BACKOFF_MAX_MS = 5_000


@dataclass(frozen=True)
class AgentOptions:
    node: sc.SidecarNode
    control_plane: Target
    tls: ClientTlsFiles | None
    token_file: Path
    sockets: sc.Sockets
    ports: sc.PodPorts
    trust_domain: str | None
    envoy_args: tuple[str, ...] = ()
    envoy_log: Path | None = None


@dataclass
class Agent:
    options: AgentOptions
    metrics: KeeperMetrics = field(default_factory=KeeperMetrics)
    state: SecretState = field(default_factory=SecretState)
    envoy: asyncio.subprocess.Process | None = None
    keeper: CertificateKeeper | None = None
    _servers: list[grpc.aio.Server] = field(default_factory=list)
    _channel: grpc.aio.Channel | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def token(self) -> str:
        return read_token(self.options.token_file, MAX_TOKEN_BYTES)

    def _open_channel(self) -> grpc.aio.Channel:
        options = [
            *_KEEPALIVE,
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MAX_MS),
        ]
        address = self.options.control_plane.address
        if self.options.tls is None:
            return grpc.aio.insecure_channel(address, options=options)
        return grpc.aio.secure_channel(address, self.options.tls.credentials(), options=options)

    async def _serve(self, path: str, add: object, servicer: object, limit: int) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit)])
        add(servicer, server)  # type: ignore[operator]
        if server.add_insecure_port(f"unix:{path}") == 0:
            raise OSError(f"cannot listen on {path}")
        await server.start()
        os.chmod(path, 0o600)  # the socket is the agent's and Envoy's only
        self._servers.append(server)

    def write_bootstrap(self) -> Path:
        path = Path(self.options.sockets.directory) / "envoy.yaml"
        doc = sc.bootstrap(self.options.node, self.options.sockets, self.options.ports)
        path.write_text(gateway_contract.bootstrap_text(doc), encoding="utf-8")
        return path

    async def start(self) -> None:
        """Sockets up, the keeper running, Envoy started."""
        sockets = self.options.sockets
        # Sockets and files the agent makes are its own (and its child Envoy's): a socket
        # is created 0600 from the start, not after a window of the default mode.
        os.umask(0o077)
        os.makedirs(sockets.directory, mode=0o700, exist_ok=True)
        self._channel = self._open_channel()
        node = self.options.node
        self.keeper = CertificateKeeper(
            grpc_signer(self._channel, node.node_cluster, node.instance),
            token=self.token,
            trust_domain=self.options.trust_domain,
            state=self.state,
            clock=time.time,
            metrics=self.metrics,
        )
        relay = AdsRelay(self._channel, self.token, self.keeper.trust_bundle_seen)
        await self._serve(
            sockets.sds,
            sds_pb2_grpc.add_SecretDiscoveryServiceServicer_to_server,
            SdsServicer(self.state),
            MAX_REQUEST_BYTES,
        )
        await self._serve(
            sockets.xds,
            ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server,
            relay,
            MAX_MESSAGE_BYTES,
        )
        self._tasks.append(asyncio.ensure_future(self.keeper.run()))
        await self._start_envoy()

    async def _start_envoy(self) -> None:
        bootstrap = self.write_bootstrap()
        args = [str(envoy_path()), "-c", str(bootstrap), "--disable-hot-restart"]
        if self.options.envoy_log is not None:
            args += ["--log-path", str(self.options.envoy_log)]
        args += list(self.options.envoy_args)
        # Envoy must never outlive its agent: an agent killed outright (SIGKILL,
        # the OOM killer) would leave it serving with certificates nobody renews.
        # The parent-death signal is set by a fresh interpreter that then execs
        # Envoy (same pid), not by a preexec_fn: that runs Python in a fork() of
        # this process while gRPC's threads are live, and the child can deadlock
        # on a lock one of them held (dlopen's, taking CDLL) before it execs,
        # stalling the agent's start (seen on a loaded CI machine).
        self.envoy = await asyncio.create_subprocess_exec(
            *tied_command(args), stdin=asyncio.subprocess.DEVNULL
        )
        log.info("started envoy", extra={"pid": self.envoy.pid, "node": self.options.node.instance})

    async def wait(self, stop: asyncio.Event) -> int:
        """Until ``stop`` is set or Envoy exits; Envoy's exit code (0 after a stop)."""
        assert self.envoy is not None
        exited = asyncio.ensure_future(self.envoy.wait())
        stopped = asyncio.ensure_future(stop.wait())
        await asyncio.wait({exited, stopped}, return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if exited.done():
            code = exited.result()
            log.warning("envoy exited", extra={"code": code})
            return code if code > 0 else 1
        exited.cancel()
        return 0

    async def stop(self) -> None:
        """Envoy, then the servers and the channel; the sockets removed."""
        if self.envoy is not None and self.envoy.returncode is None:
            self.envoy.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(ENVOY_STOP_SECONDS):
                    await self.envoy.wait()
            except TimeoutError:
                self.envoy.kill()
                await self.envoy.wait()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for server in self._servers:
            await server.stop(1.0)
        if self._channel is not None:
            await self._channel.close()
        sockets = self.options.sockets
        for path in (sockets.xds, sockets.sds, sockets.admin):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        log.info("stopped")


async def run(options: AgentOptions, metrics: KeeperMetrics | None = None) -> int:
    """Run until SIGTERM/SIGINT or Envoy's exit; the exit code."""
    agent = Agent(options, metrics or KeeperMetrics())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await agent.start()
        return await agent.wait(stop)
    finally:
        await agent.stop()
