"""``meshctl gateway bootstrap``: the minimal bootstrap a gateway Envoy starts from.

A gateway of a cluster receives its listener, routes, filters and upstream
clusters from mgmt-api over ADS; all it needs on disk is who it is, where
the ADS server is, and a token proving it belongs to the cluster
(:mod:`meshplane.gateway_contract`). This command renders that file from the
cluster's gateway credentials (the install template's
``gatewayServiceAccount``, in the format ``ratelimit``/``extauthz
--credentials`` read), offline: it calls no
server, so it runs where the key is (a CI job, an init container) and the
key never travels.

The token in the bootstrap lives
:data:`~meshplane.gateway_contract.GATEWAY_TOKEN_TTL_SECONDS` (Envoy cannot
mint tokens); render the file again before it expires. The file is a
secret: ``-o FILE`` writes it mode 0600.
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from meshctl.errors import Exit, MeshctlError
from meshplane import control_plane, gateway_contract
from meshplane.config_error import ConfigError
from meshplane.netaddr import format_listen, parse_listen
from meshplane.secret_file import write_secret

app = typer.Typer(help="Gateway Envoys configured over ADS by the management plane.")

_DEFAULT_LISTEN = format_listen(
    gateway_contract.DEFAULT_LISTEN_HOST, gateway_contract.DEFAULT_LISTEN_PORT
)
_DEFAULT_ADMIN = format_listen(*gateway_contract.DEFAULT_ADMIN)


def _usage(message: str) -> MeshctlError:
    return MeshctlError(message, Exit.USAGE)


def _address(value: str, flag: str) -> tuple[str, int]:
    try:
        host, port = parse_listen(value)
    except ValueError:
        raise _usage(f"{flag} must be HOST:PORT, not {value!r}") from None
    if not 0 < port < 65536:
        raise _usage(f"{flag} needs a port 1-65535, not {value!r}")
    return host, port


def _cluster(value: str) -> tuple[str, str]:
    organization, sep, cluster = value.partition("/")
    if not sep or not organization or not cluster or "/" in cluster:
        raise _usage(f"--cluster must be ORGANIZATION/CLUSTER, not {value!r}")
    return organization, cluster


def render(
    *,
    cluster: str,
    credentials: Path,
    ads: str,
    node_id: str | None = None,
    listen: str = _DEFAULT_LISTEN,
    gateway_name: str = gateway_contract.DEFAULT_GATEWAY_NAME,
    ratelimit_service: str = gateway_contract.DEFAULT_RATELIMIT_SERVICE,
    admin: str = _DEFAULT_ADMIN,
    ca: str | None = None,
    cert: str | None = None,
    key: str | None = None,
) -> dict[str, Any]:
    """The bootstrap as a dict; every bad input is a usage :class:`MeshctlError`.

    The node is checked with the same :func:`~meshplane.gateway_contract.parse_node`
    the ADS server applies, so a bootstrap this prints is one the server accepts.
    """
    organization, cluster_name = _cluster(cluster)
    listen_host, listen_port = _address(listen, "--listen")
    admin_address = _address(admin, "--admin")
    tls_files = ca or cert or key
    if tls_files and not ads.startswith("grpcs://"):
        raise _usage("--ca, --cert and --key go with a grpcs:// --ads address")
    try:
        account = control_plane.load_credentials(credentials)
    except ConfigError as exc:
        raise _usage(f"--credentials: {exc}") from None
    expected = f"organizations/{organization}/clusters/{cluster_name}"
    if account.cluster_fqn and account.cluster_fqn != expected:
        raise _usage(
            f"--credentials are the key of {account.cluster_fqn}, not of {expected}:"
            " a gateway authenticates with its own cluster's key"
        )
    node = gateway_contract.GatewayNode(
        organization,
        cluster_name,
        node_id or socket.gethostname(),
        listen_host=listen_host,
        listen_port=listen_port,
        gateway_name=gateway_name,
        ratelimit_service=ratelimit_service,
    )
    try:
        gateway_contract.parse_node(node.instance, node.node_cluster, node.metadata())
        token = account.token(
            ttl=gateway_contract.GATEWAY_TOKEN_TTL_SECONDS,
            audience=gateway_contract.XDS_AUDIENCE,
        )
        return gateway_contract.bootstrap(
            node,
            ads=ads,
            token=token,
            admin=admin_address,
            ca_file=ca,
            cert_file=cert,
            key_file=key,
        )
    except gateway_contract.NodeError as exc:
        raise _usage(_flag_words(str(exc))) from None


def _flag_words(message: str) -> str:
    """The contract's wording, in the flags' terms."""
    return (
        message.replace(
            f"node.metadata[{gateway_contract.RATELIMIT_SERVICE_KEY!r}]", "--ratelimit-service"
        )
        .replace(f"node.metadata[{gateway_contract.GATEWAY_NAME_KEY!r}]", "--gateway-name")
        .replace("the listener address", "the --listen host")
        .replace("the ADS address", "--ads")
    )


@app.command("bootstrap")
def bootstrap_command(  # noqa: PLR0917 - typer maps options to parameters
    cluster: Annotated[
        str, typer.Option("--cluster", help="ORGANIZATION/CLUSTER the gateway serves.")
    ],
    credentials: Annotated[
        Path,
        typer.Option(
            "--credentials",
            help="The cluster's gateway key: the install template's gatewayServiceAccount "
            "(or its jwk).",
        ),
    ],
    ads: Annotated[
        str,
        typer.Option("--ads", help="mgmt-api's gRPC port: grpc://HOST:PORT or grpcs://HOST:PORT."),
    ],
    ca: Annotated[
        str | None, typer.Option("--ca", help="CA file that signs mgmt-api's certificate (grpcs).")
    ] = None,
    cert: Annotated[
        str | None, typer.Option("--cert", help="Client certificate file, for mutual TLS.")
    ] = None,
    key: Annotated[str | None, typer.Option("--key", help="The client certificate's key.")] = None,
    node_id: Annotated[
        str | None,
        typer.Option("--node-id", help="This gateway instance's id (default: the host name)."),
    ] = None,
    listen: Annotated[
        str, typer.Option("--listen", help="HOST:PORT the gateway serves traffic on.")
    ] = _DEFAULT_LISTEN,
    gateway_name: Annotated[
        str,
        typer.Option("--gateway-name", help="The Gateway name HTTPRoutes' parentRefs use."),
    ] = gateway_contract.DEFAULT_GATEWAY_NAME,
    ratelimit_service: Annotated[
        str,
        typer.Option(
            "--ratelimit-service", help="Where this gateway reaches ratelimit: grpc://HOST:PORT."
        ),
    ] = gateway_contract.DEFAULT_RATELIMIT_SERVICE,
    admin: Annotated[
        str, typer.Option("--admin", help="HOST:PORT of Envoy's admin listener.")
    ] = _DEFAULT_ADMIN,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write here (mode 0600) instead of stdout."),
    ] = None,
    fmt: Annotated[str, typer.Option("--format", help="yaml or json.")] = "yaml",
) -> None:
    """Print a gateway's bootstrap (node, admin, ADS with a token); it holds a secret."""
    if fmt not in ("yaml", "json"):
        raise _usage(f"--format must be yaml or json, not {fmt!r}")
    doc = render(
        cluster=cluster,
        credentials=credentials,
        ads=ads,
        node_id=node_id,
        listen=listen,
        gateway_name=gateway_name,
        ratelimit_service=ratelimit_service,
        admin=admin,
        ca=ca,
        cert=cert,
        key=key,
    )
    text = gateway_contract.bootstrap_text(doc, fmt)
    expires = datetime.fromtimestamp(
        datetime.now(UTC).timestamp() + gateway_contract.GATEWAY_TOKEN_TTL_SECONDS, UTC
    ).strftime("%Y-%m-%d %H:%M UTC")
    if output is None:
        typer.echo(text, nl=False)
    else:
        try:
            write_secret(output, text)
        except OSError as exc:
            raise _usage(f"cannot write {output}: {exc.strerror}") from None
        typer.echo(f"Wrote the bootstrap of gateway {doc['node']['id']} to {output}.", err=True)
    typer.echo(
        f"It holds a token valid until {expires}: keep it secret, render it again before then.",
        err=True,
    )
