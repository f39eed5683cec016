"""``meshplane-agent``: the cluster agent, one per cluster.

    meshplane-agent --control-plane grpcs://mgmt.example:8444 --control-plane-ca ca.pem \\
        --cluster ORG/CLUSTER --credentials /etc/meshplane/agent-key.json \\
        (--static-proxies proxies.yaml | --kubernetes [--selector ...] [--admin-port 15000]) \\
        [--workload-token /var/run/secrets/meshplane.io/token --trust-domain TD]

The credentials are the cluster's service-account key from its install
template (``helm.secrets.clusterServiceAccount``), read as the policy
stream's subscribers read them (:mod:`meshplane.control_plane`), and so are
the TLS flags. SIGTERM drains: new calls are refused, log streams end,
unary calls get a few seconds to finish, then the tunnel closes and the
process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path

import grpc

from agent import contract
from agent.diagnostics import Diagnostics
from agent.discovery import ProxySource
from agent.discovery.kubernetes import DEFAULT_SELECTOR, DEFAULT_WORKLOAD_LABELS, KubernetesSource
from agent.discovery.static import StaticSource
from agent.envoy_admin import DEFAULT_MAX_RESPONSE_BYTES, AdminClient
from agent.health import HealthServer
from agent.mesh_identity import MeshIdentity
from agent.metrics import AgentMetrics
from agent.tunnel import Tunnel
from meshplane import control_plane, tracing, workload_contract
from meshplane import sidecar_contract as sc
from meshplane.cli_args import fail
from meshplane.config_error import ConfigError
from meshplane.logging import configure_logging
from meshplane.netaddr import parse_listen
from meshplane.proto.tunnel.v1 import tunnel_pb2 as pb
from sidecar_agent.certificates import KeeperMetrics

log = logging.getLogger("agent")

VERSION = "0.1.0"
SERVICE = "meshplane-agent"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=SERVICE,
        description="The meshplane cluster agent: inventory and proxy diagnostics over one "
        "outbound tunnel to the management plane.",
    )
    control_plane.add_arguments(p, title="management plane", cache=False)
    p.add_argument(
        "--listen",
        default="127.0.0.1:9105",
        help="HOST:PORT of /metrics, /healthz and /readyz (default 127.0.0.1:9105)",
    )
    p.add_argument("--instance", help="this agent's name in the management plane's view")
    tracing.add_arguments(p)  # spans for tunnel calls (docs/observability.md)
    discovery = p.add_argument_group("proxy discovery (one of)")
    discovery.add_argument(
        "--static-proxies",
        help="YAML/JSON file of {namespace, workload, instance, adminAddress, logFile}",
    )
    discovery.add_argument(
        "--kubernetes", action="store_true", help="pods of this cluster (in-cluster credentials)"
    )
    discovery.add_argument(
        "--selector",
        default=DEFAULT_SELECTOR,
        help=f"pod label selector (default {DEFAULT_SELECTOR})",
    )
    discovery.add_argument(
        "--namespace",
        action="append",
        help="only pods of this namespace (repeatable; default: every namespace)",
    )
    discovery.add_argument(
        "--admin-port", type=int, default=15000, help="the proxies' admin port (default 15000)"
    )
    discovery.add_argument(
        "--container", default="istio-proxy", help="the proxy container (pod logs)"
    )
    discovery.add_argument(
        "--workload-label",
        action="append",
        help="pod label naming the workload, first present wins (repeatable; default "
        + ", ".join(DEFAULT_WORKLOAD_LABELS)
        + ")",
    )
    discovery.add_argument(
        "--kube-api", help="API server URL (default: from the in-cluster environment)"
    )
    discovery.add_argument(
        "--kube-credentials-dir",
        help="dir with token, ca.crt (default /var/run/secrets/kubernetes.io/serviceaccount)",
    )
    mesh = p.add_argument_group("sidecars (the agent's own mesh certificate)")
    mesh.add_argument(
        "--workload-token",
        help="the agent pod's projected token (audience meshplane): with it the agent signs "
        "a mesh certificate and reaches sidecars on their mTLS diagnostics port",
    )
    mesh.add_argument(
        "--trust-domain",
        help="the cluster's trust domain, when its spec sets one (with --workload-token; "
        "default CLUSTER.ORG.mesh.local, a cluster's default)",
    )
    mesh.add_argument(
        "--diagnostics-port",
        type=int,
        default=sc.DEFAULT_DIAGNOSTICS_PORT,
        help="the sidecars' diagnostics port (--kubernetes with --workload-token; default "
        f"{sc.DEFAULT_DIAGNOSTICS_PORT})",
    )
    limits = p.add_argument_group("limits")
    limits.add_argument(
        "--max-response-bytes",
        type=int,
        default=DEFAULT_MAX_RESPONSE_BYTES,
        help="largest admin answer read from a proxy (default 32 MiB); larger: a clear error",
    )
    limits.add_argument(
        "--max-concurrent", type=int, default=64, help="diagnostics calls at once (default 64)"
    )
    limits.add_argument(
        "--max-backoff", type=float, default=15.0, help="longest wait between reconnects (s)"
    )
    return p


def _source(args: argparse.Namespace) -> ProxySource:
    if bool(args.static_proxies) == bool(args.kubernetes):
        raise ConfigError("give exactly one of --static-proxies FILE and --kubernetes")
    if args.static_proxies:
        try:
            return StaticSource(Path(args.static_proxies), VERSION)
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc.strerror}", field="--static-proxies") from None
    mtls = bool(args.workload_token)
    flag, port = ("--diagnostics-port", args.diagnostics_port) if mtls else (
        "--admin-port", args.admin_port)  # fmt: skip
    if not 0 < port < 65536:
        raise ConfigError("must be a port number", field=flag)
    return KubernetesSource.in_cluster(
        mtls=mtls,
        selector=args.selector,
        namespaces=tuple(args.namespace or ()),
        admin_port=port,
        container=args.container,
        workload_labels=tuple(args.workload_label or DEFAULT_WORKLOAD_LABELS),
        api_url=args.kube_api,
        credentials_dir=Path(args.kube_credentials_dir) if args.kube_credentials_dir else None,
        agent_version=VERSION,
    )


def _mesh_identity(
    args: argparse.Namespace,
    options: control_plane.ControlPlaneOptions,
    instance: str,
    metrics: AgentMetrics,
) -> tuple[MeshIdentity | None, grpc.aio.Channel | None]:
    """The agent's mesh certificate keeper, with ``--workload-token`` (else None)."""
    if not args.workload_token:
        if args.trust_domain:
            raise ConfigError("only with --workload-token", field="--trust-domain")
        return None, None
    trust_domain = args.trust_domain or workload_contract.default_trust_domain(
        options.organization, options.cluster
    )
    token = Path(args.workload_token)
    if not token.is_file():
        raise ConfigError(f"no such file: {token}", field="--workload-token")
    credentials = options.channel_credentials()
    channel = (
        grpc.aio.insecure_channel(options.address)
        if credentials is None
        else grpc.aio.secure_channel(options.address, credentials)
    )
    node_cluster = f"{options.organization}/{options.cluster}"
    hooks = KeeperMetrics(
        issued=lambda issued: metrics.certificate_expiry.set(issued.not_after),
        failed=metrics.sign_failures.inc,
    )
    return (
        MeshIdentity(channel, node_cluster, instance, token, trust_domain, metrics=hooks),
        channel,
    )


async def serve(
    args: argparse.Namespace,
    options: control_plane.ControlPlaneOptions,
    trace_settings: tracing.TraceSettings,
) -> int:
    source = _source(args)
    metrics = AgentMetrics()
    instance = args.instance or f"{socket.gethostname()}-{os.getpid()}"
    mesh, sign_channel = _mesh_identity(args, options, instance, metrics)
    admin_client = AdminClient(args.max_response_bytes, mesh)
    traces = tracing.start_tracing(trace_settings)
    tunnel = Tunnel(
        address=options.address,
        hello=pb.AgentHello(
            organization=options.organization,
            cluster=options.cluster,
            instance=instance,
            version=VERSION,
        ),
        token=lambda: options.key.token(audience=contract.TUNNEL_AUDIENCE),
        diagnostics=Diagnostics(source, admin_client),
        source=source,
        metrics=metrics,
        channel_credentials=options.channel_credentials(),
        max_concurrent=args.max_concurrent,
        max_backoff=args.max_backoff,
        tracing=traces,
    )
    health = HealthServer(args.listen, metrics.render, lambda: tunnel.connected)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    port = await health.start()
    if mesh is not None:
        mesh.start()
    log.info(
        "agent started",
        extra={
            "cluster": f"{options.organization}/{options.cluster}",
            "control_plane": options.address,
            "tls": options.tls is not None,
            "discovery": source.kind,
            "instance": instance,
            "health_port": port,
        },
    )
    try:
        await tunnel.run(stop)
    finally:
        await health.stop()
        if mesh is not None:
            await mesh.stop()
        if sign_channel is not None:
            await sign_channel.close()
        await admin_client.close()
        await source.close()
        if traces is not None:  # export what is queued before exiting
            await asyncio.to_thread(traces.shutdown)
    log.info("agent stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging(SERVICE)
    # One line per admin request at INFO would drown the agent's own log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        if not args.control_plane:
            raise ConfigError("is required", field="--control-plane")
        parse_listen(args.listen)
        options = control_plane.options_from(args, "agent")
        assert options is not None
        trace_settings = tracing.settings_from_args(args, os.environ, SERVICE)
        return asyncio.run(serve(args, options, trace_settings))
    except ConfigError as exc:
        return fail(SERVICE, str(exc))
    except ValueError as exc:
        return fail(SERVICE, str(exc))


if __name__ == "__main__":
    sys.exit(main())
