"""``meshplane-sidecar-agent``: the pod-local agent that runs a workload's sidecar Envoy.

    meshplane-sidecar-agent --control-plane grpcs://mgmt.example:8444 \\
        --control-plane-ca ca.pem --cluster ORG/CLUSTER --service web --app-port 8080 \\
        [--node-id POD] [--inbound POD_IP:15006] [--outbound-port 15001] \\
        [--token-file /var/run/secrets/meshplane.io/token] [--socket-dir /var/run/meshplane] \\
        [--trust-domain TD] [--listen 127.0.0.1:15020] [--envoy-arg ARG ...] \\
        [--diagnostics-caller NS/SA [--diagnostics-port 15021]] [--prometheus-port 15090]

The workload's namespace and service account are not flags: they are the
token's (mgmt-api verifies it and takes them from there). The injector
runs this as the sidecar container's command; outside Kubernetes (a VM,
``scripts/run``) the token is a JWT of the same shape from an issuer the
cluster's admin registered (docs/mesh.md). ``--print-bootstrap`` prints
the Envoy bootstrap this agent would start (it holds no secret) and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from meshplane import gateway_contract, workload_contract
from meshplane import sidecar_contract as sc
from meshplane.config_error import ConfigError
from meshplane.control_plane import ClientTlsFiles, parse_target
from meshplane.logging import configure_logging
from meshplane.netaddr import format_listen, parse_listen
from sidecar_agent import identity
from sidecar_agent.relay import read_token
from sidecar_agent.runtime import AgentOptions, run
from sidecar_agent.status import StatusServer

SERVICE = "meshplane-sidecar-agent"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=SERVICE, description=__doc__.split("\n\n")[0])
    p.add_argument("--control-plane", required=True, help="mgmt-api's gRPC port: grpc(s)://H:P")
    p.add_argument(
        "--control-plane-ca",
        help="PEM CA that signs mgmt-api's certificate (grpcs://; default: "
        f"${sc.CONTROL_PLANE_CA_ENV}, a PEM by value)",
    )
    p.add_argument("--cluster", required=True, help="ORGANIZATION/CLUSTER")
    p.add_argument("--service", required=True, help="the service name others call this at")
    p.add_argument("--app-port", type=int, required=True, help="the app's port on loopback")
    p.add_argument("--node-id", help="the instance (default: the host name, a pod's name)")
    p.add_argument(
        "--inbound",
        default=format_listen("127.0.0.1", sc.DEFAULT_INBOUND_PORT),
        help="HOST:PORT of the inbound listener: the pod IP, routable from other sidecars",
    )
    p.add_argument("--outbound-port", type=int, default=sc.DEFAULT_OUTBOUND_PORT)
    p.add_argument("--token-file", default=str(workload_contract.DEFAULT_TOKEN_PATH))
    p.add_argument("--socket-dir", default=str(workload_contract.DEFAULT_SOCKET_DIR))
    p.add_argument(
        "--trust-domain",
        help="the mesh's trust domain (default: the one the cluster's mesh CA names)",
    )
    p.add_argument("--listen", help="HOST:PORT of /metrics, /healthz, /readyz (default: none)")
    p.add_argument(
        "--diagnostics-caller",
        help="NAMESPACE/SERVICEACCOUNT of the cluster agent: the only client certificate "
        "(of the mesh CA) the mTLS diagnostics port accepts (default: no such port)",
    )
    p.add_argument(
        "--diagnostics-port",
        type=int,
        default=sc.DEFAULT_DIAGNOSTICS_PORT,
        help="the pod port of the allow-listed admin API, with --diagnostics-caller",
    )
    p.add_argument(
        "--prometheus-port",
        type=int,
        default=0,
        help=f"the pod port serving GET /stats/prometheus only (e.g. {sc.DEFAULT_PROMETHEUS_PORT};"
        " default: none)",
    )
    p.add_argument("--envoy-arg", action="append", default=[], help="an extra Envoy flag")
    p.add_argument("--envoy-log", help="Envoy's log file (default: its stderr)")
    p.add_argument("--print-bootstrap", action="store_true", help="print the bootstrap, exit")
    return p


def _fail(message: str) -> NoReturn:
    print(f"{SERVICE}: {message}", file=sys.stderr)
    raise SystemExit(2)


def _tls(args: argparse.Namespace, tls: bool) -> ClientTlsFiles | None:
    """The CA of a grpcs:// control plane: the flag's file, or the PEM the injector passes."""
    if not tls:
        if args.control_plane_ca:
            raise ConfigError("only with a grpcs:// --control-plane", field="--control-plane-ca")
        return None
    path = args.control_plane_ca
    pem = os.environ.get(sc.CONTROL_PLANE_CA_ENV)
    if not path and pem:
        path = str(Path(args.socket_dir) / "control-plane-ca.pem")
        Path(args.socket_dir).mkdir(parents=True, exist_ok=True, mode=0o700)
        Path(path).write_text(pem, encoding="ascii")
    files = ClientTlsFiles(ca=Path(path) if path else None)
    files.credentials()  # an unreadable file stops the start, naming the flag
    return files


def options(args: argparse.Namespace) -> AgentOptions:
    """Check the flags and read the token's identity; ConfigError names the flag."""
    try:
        target = parse_target(args.control_plane)
    except ValueError as exc:
        raise ConfigError(str(exc), field="--control-plane") from None
    organization, sep, cluster = args.cluster.partition("/")
    if not sep or not organization or not cluster or "/" in cluster:
        raise ConfigError("must be ORGANIZATION/CLUSTER", field="--cluster")
    try:
        claims = identity.token_claims(read_token(Path(args.token_file), identity.MAX_TOKEN_BYTES))
        inbound_host, inbound_port = parse_listen(args.inbound)
    except ValueError as exc:
        field = "--token-file" if isinstance(exc, identity.TokenUnreadable) else "--inbound"
        raise ConfigError(str(exc), field=field) from None
    node = sc.SidecarNode(
        organization,
        cluster,
        args.node_id or socket.gethostname(),
        claims.namespace,
        claims.service_account,
        args.service,
        args.app_port,
        inbound_host,
        inbound_port,
        args.outbound_port,
    )
    try:
        sc.parse_node(node.instance, node.node_cluster, node.metadata())
    except gateway_contract.NodeError as exc:
        raise ConfigError(str(exc)) from None
    sockets = sc.Sockets(str(Path(args.socket_dir).absolute()))
    ports = _pod_ports(args, node)
    if not sockets.fits():
        raise ConfigError("is too long for a Unix socket path", field="--socket-dir")
    return AgentOptions(
        node=node,
        control_plane=target,
        tls=_tls(args, target.tls),
        token_file=Path(args.token_file),
        sockets=sockets,
        ports=ports,
        trust_domain=args.trust_domain or None,
        envoy_args=tuple(args.envoy_arg),
        envoy_log=Path(args.envoy_log) if args.envoy_log else None,
    )


def _pod_ports(args: argparse.Namespace, node: sc.SidecarNode) -> sc.PodPorts:
    """The diagnostics and metrics ports; ConfigError names the flag."""
    caller = ""
    if args.diagnostics_caller:
        try:
            caller = sc.parse_caller(args.diagnostics_caller)
        except ValueError as exc:
            raise ConfigError(str(exc), field="--diagnostics-caller") from None
    taken = {node.app_port, node.inbound_port, node.outbound_port}
    for flag, port in (
        ("--diagnostics-port", args.diagnostics_port if caller else 0),
        ("--prometheus-port", args.prometheus_port),
    ):
        if port and (not 0 < port < 65536 or port in taken):
            raise ConfigError("must be a free port 1-65535 of its own", field=flag)
        taken.add(port)
    return sc.PodPorts(
        diagnostics=args.diagnostics_port if caller else 0,
        caller=caller,
        prometheus=args.prometheus_port,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure_logging(SERVICE)
    try:
        opts = options(args)
    except ConfigError as exc:
        _fail(str(exc))
    if args.print_bootstrap:
        print(
            gateway_contract.bootstrap_text(sc.bootstrap(opts.node, opts.sockets, opts.ports)),
            end="",
        )
        return 0
    status = StatusServer()
    if args.listen:
        try:
            status.start(*parse_listen(args.listen))
        except (ValueError, OSError) as exc:
            _fail(f"--listen: {exc}")
    try:
        return asyncio.run(run(opts, status.keeper_metrics()))
    finally:
        status.stop()


if __name__ == "__main__":
    raise SystemExit(main())
