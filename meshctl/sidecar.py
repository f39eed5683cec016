"""``meshctl sidecar bootstrap``: how a workload's sidecar starts outside Kubernetes (a VM).

A sidecar Envoy is run by the pod-local sidecar agent
(``meshplane-sidecar-agent``): the agent holds the workload's token, makes
its key, has its certificate signed and relays ADS, all over Unix sockets
only the two share; Envoy's bootstrap holds no token and no key
(:mod:`meshplane.sidecar_contract`, docs/mesh.md). This command prints,
offline, either the agent's command line (``--format command``, the
default: what a VM's service unit runs) or the Envoy bootstrap the agent
writes (``yaml``/``json``, to review it). Neither holds a secret; the
workload's namespace and service account are the token's, so
``--namespace``/``--service-account`` only render the node as mgmt-api will
check it against the token.
"""

from __future__ import annotations

import shlex
import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from meshctl.gateway import _address, _cluster, _usage
from meshplane import gateway_contract, sidecar_contract, workload_contract
from meshplane.netaddr import format_listen

app = typer.Typer(help="Workload sidecar Envoys run by the pod-local sidecar agent.")

AGENT_COMMAND = "meshplane-sidecar-agent"
_DEFAULT_INBOUND = format_listen("127.0.0.1", sidecar_contract.DEFAULT_INBOUND_PORT)


def render(
    *,
    cluster: str,
    ads: str,
    namespace: str,
    service_account: str,
    service: str,
    app_port: int,
    node_id: str | None = None,
    inbound: str = _DEFAULT_INBOUND,
    outbound_port: int = sidecar_contract.DEFAULT_OUTBOUND_PORT,
    socket_dir: str = str(workload_contract.DEFAULT_SOCKET_DIR),
) -> dict[str, Any]:
    """The bootstrap the agent writes, as a dict, the node checked as the ADS server checks it."""
    organization, cluster_name = _cluster(cluster)
    inbound_host, inbound_port = _address(inbound, "--inbound")
    try:
        gateway_contract.grpc_address(ads, "--ads")
    except gateway_contract.NodeError as exc:
        raise _usage(str(exc)) from None
    node = sidecar_contract.SidecarNode(
        organization,
        cluster_name,
        node_id or socket.gethostname(),
        namespace,
        service_account,
        service,
        app_port,
        inbound_host,
        inbound_port,
        outbound_port,
    )
    try:
        sidecar_contract.parse_node(node.instance, node.node_cluster, node.metadata())
    except gateway_contract.NodeError as exc:
        raise _usage(str(exc)) from None
    return sidecar_contract.bootstrap(node, sidecar_contract.Sockets(socket_dir))


def command_line(
    *,
    cluster: str,
    ads: str,
    service: str,
    app_port: int,
    node_id: str | None,
    inbound: str,
    outbound_port: int,
    socket_dir: str,
    token_file: str,
    ca: str | None,
) -> list[str]:
    """The agent's argv for these settings."""
    argv = [AGENT_COMMAND, "--control-plane", ads, "--cluster", cluster]
    if ca:
        argv += ["--control-plane-ca", ca]
    argv += ["--service", service, "--app-port", str(app_port)]
    if node_id:
        argv += ["--node-id", node_id]
    argv += ["--inbound", inbound, "--outbound-port", str(outbound_port)]
    argv += ["--token-file", token_file, "--socket-dir", socket_dir]
    return argv


@app.command("bootstrap")
def bootstrap_command(  # noqa: PLR0917 - typer maps options to parameters
    cluster: Annotated[str, typer.Option("--cluster", help="ORGANIZATION/CLUSTER.")],
    ads: Annotated[str, typer.Option("--ads", help="mgmt-api's gRPC port: grpc(s)://HOST:PORT.")],
    namespace: Annotated[str, typer.Option("--namespace", help="The token's namespace.")],
    service_account: Annotated[
        str, typer.Option("--service-account", help="The token's service account.")
    ],
    service: Annotated[str, typer.Option("--service", help="The service name others call.")],
    app_port: Annotated[int, typer.Option("--app-port", help="The app's port on loopback.")],
    node_id: Annotated[
        str | None, typer.Option("--node-id", help="Instance id (default: the host name).")
    ] = None,
    inbound: Annotated[
        str, typer.Option("--inbound", help="HOST:PORT of the inbound listener (routable).")
    ] = _DEFAULT_INBOUND,
    outbound_port: Annotated[
        int, typer.Option("--outbound-port", help="Loopback port of the outbound listener.")
    ] = sidecar_contract.DEFAULT_OUTBOUND_PORT,
    socket_dir: Annotated[
        str, typer.Option("--socket-dir", help="The agent's and Envoy's private directory.")
    ] = str(workload_contract.DEFAULT_SOCKET_DIR),
    token_file: Annotated[
        str, typer.Option("--token-file", help="The workload token (a registered issuer's JWT).")
    ] = str(workload_contract.DEFAULT_TOKEN_PATH),
    ca: Annotated[
        str | None, typer.Option("--ca", help="CA file that signs mgmt-api's certificate (grpcs).")
    ] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write here.")] = None,
    fmt: Annotated[str, typer.Option("--format", help="command, yaml or json.")] = "command",
) -> None:
    """Print the sidecar agent's command line, or the Envoy bootstrap it writes (no secret)."""
    if fmt not in ("command", "yaml", "json"):
        raise _usage(f"--format must be command, yaml or json, not {fmt!r}")
    doc = render(
        cluster=cluster,
        ads=ads,
        namespace=namespace,
        service_account=service_account,
        service=service,
        app_port=app_port,
        node_id=node_id,
        inbound=inbound,
        outbound_port=outbound_port,
        socket_dir=socket_dir,
    )
    if fmt == "command":
        argv = command_line(
            cluster=cluster,
            ads=ads,
            service=service,
            app_port=app_port,
            node_id=doc["node"]["id"],
            inbound=inbound,
            outbound_port=outbound_port,
            socket_dir=socket_dir,
            token_file=token_file,
            ca=ca,
        )
        text = shlex.join(argv) + "\n"
    else:
        text = gateway_contract.bootstrap_text(doc, fmt)
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise _usage(f"cannot write {output}: {exc.strerror}") from None
    typer.echo(f"Wrote the sidecar {doc['node']['id']}'s {fmt} to {output}.", err=True)
