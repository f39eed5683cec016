"""``meshctl sidecar bootstrap``: the minimal bootstrap a workload's sidecar Envoy starts from.

The sidecar's shape, identity and authorization all come over ADS
(:mod:`meshplane.sidecar_contract`, docs/mesh.md); on disk it needs who it
is (cluster, namespace, service account, service, ports), where the ADS
server is, and a token of the cluster's key. Rendered offline, as
``meshctl gateway bootstrap`` renders a gateway's; the file is a secret.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Annotated, Any

import typer

from meshctl.gateway import _address, _cluster, _usage
from meshplane import control_plane, gateway_contract, sidecar_contract
from meshplane.config_error import ConfigError
from meshplane.netaddr import format_listen
from meshplane.secret_file import write_secret

app = typer.Typer(help="Workload sidecar Envoys configured over ADS by the management plane.")


def render(
    *,
    cluster: str,
    credentials: Path,
    ads: str,
    namespace: str,
    service_account: str,
    service: str,
    app_port: int,
    node_id: str | None = None,
    inbound: str = format_listen("127.0.0.1", sidecar_contract.DEFAULT_INBOUND_PORT),
    outbound_port: int = sidecar_contract.DEFAULT_OUTBOUND_PORT,
    admin: str = format_listen(*sidecar_contract.DEFAULT_ADMIN),
    ca: str | None = None,
) -> dict[str, Any]:
    """The bootstrap as a dict, the node checked as the ADS server checks it."""
    organization, cluster_name = _cluster(cluster)
    inbound_host, inbound_port = _address(inbound, "--inbound")
    admin_address = _address(admin, "--admin")
    try:
        account = control_plane.load_credentials(credentials)
    except ConfigError as exc:
        raise _usage(f"--credentials: {exc}") from None
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
        token = account.token(
            ttl=gateway_contract.GATEWAY_TOKEN_TTL_SECONDS,
            audience=gateway_contract.XDS_AUDIENCE,
        )
        return sidecar_contract.bootstrap(
            node, ads=ads, token=token, admin=admin_address, ca_file=ca
        )
    except gateway_contract.NodeError as exc:
        raise _usage(str(exc).replace("the ADS address", "--ads")) from None


@app.command("bootstrap")
def bootstrap_command(  # noqa: PLR0917 - typer maps options to parameters
    cluster: Annotated[str, typer.Option("--cluster", help="ORGANIZATION/CLUSTER.")],
    credentials: Annotated[
        Path, typer.Option("--credentials", help="The cluster's key (clusterServiceAccount).")
    ],
    ads: Annotated[str, typer.Option("--ads", help="mgmt-api's gRPC port: grpc(s)://HOST:PORT.")],
    namespace: Annotated[str, typer.Option("--namespace", help="The workload's namespace.")],
    service_account: Annotated[
        str, typer.Option("--service-account", help="The workload's service account.")
    ],
    service: Annotated[str, typer.Option("--service", help="The service name others call.")],
    app_port: Annotated[int, typer.Option("--app-port", help="The app's port on loopback.")],
    node_id: Annotated[
        str | None, typer.Option("--node-id", help="Instance id (default: the host name).")
    ] = None,
    inbound: Annotated[
        str, typer.Option("--inbound", help="HOST:PORT of the inbound listener (routable).")
    ] = format_listen("127.0.0.1", sidecar_contract.DEFAULT_INBOUND_PORT),
    outbound_port: Annotated[
        int, typer.Option("--outbound-port", help="Loopback port of the outbound listener.")
    ] = sidecar_contract.DEFAULT_OUTBOUND_PORT,
    admin: Annotated[
        str, typer.Option("--admin", help="HOST:PORT of Envoy's admin listener.")
    ] = format_listen(*sidecar_contract.DEFAULT_ADMIN),
    ca: Annotated[
        str | None, typer.Option("--ca", help="CA file that signs mgmt-api's certificate (grpcs).")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Write here (mode 0600).")
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="yaml or json.")] = "yaml",
) -> None:
    """Print a sidecar's bootstrap (node, admin, ADS with a token); it holds a secret."""
    if fmt not in ("yaml", "json"):
        raise _usage(f"--format must be yaml or json, not {fmt!r}")
    doc = render(
        cluster=cluster,
        credentials=credentials,
        ads=ads,
        namespace=namespace,
        service_account=service_account,
        service=service,
        app_port=app_port,
        node_id=node_id,
        inbound=inbound,
        outbound_port=outbound_port,
        admin=admin,
        ca=ca,
    )
    text = gateway_contract.bootstrap_text(doc, fmt)
    if output is None:
        typer.echo(text, nl=False)
        return
    try:
        write_secret(output, text)
    except OSError as exc:
        raise _usage(f"cannot write {output}: {exc.strerror}") from None
    typer.echo(f"Wrote the bootstrap of sidecar {doc['node']['id']} to {output}.", err=True)
