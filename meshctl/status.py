"""``meshctl status``: has every instance applied what its cluster's policies compile to?

Reads ``GET .../clusters/{c}/status`` (the server's one view of every
subscribed ratelimit and extauthz instance and gateway Envoy) for one cluster
(``--cluster ORG/CLUSTER``) or every cluster of the organization the user can
list, and prints one row per instance: its applied and wanted version, ACK or
NACK with the error, and its last contact; then the cluster's warnings (a
policy or route naming an object that does not exist; they do not change
the exit code); then, for a cluster whose mesh CA
was ever rotated, one line (:func:`meshctl.meshca.describe`: the rotation's
phase and progress).
The exit code makes it a CI gate:

- 0: no instance is failing (those still applying are shown as such);
- 7 (:data:`UNHEALTHY`): an instance NACKed the wanted version, is stale or
  disconnected, or the cluster's policies do not compile;
- the usual meshctl codes for the API's refusals (docs/meshctl.md).

Pure parts (:func:`instance_state`, :func:`failing`, :func:`render_table`)
take the status bodies and the clock as arguments; the command is the
one-command :data:`app` at the end (a row of ``meshctl.cli.LAZY_COMMANDS``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any

import typer
import yaml

from meshctl.client import ApiClient
from meshctl.errors import ApiFailure, Exit, MeshctlError
from meshctl.kinds import parse_fqn, require_kind, resolve_parents
from meshctl.meshca import describe as describe_mesh_ca
from meshctl.ops import list_objects, refine
from meshctl.output import age, check_format, table
from meshctl.state import state_of
from meshplane.distribution_contract import SERVICE_KINDS
from meshplane.gateway_contract import GATEWAY_KIND
from meshplane.sidecar_contract import SIDECAR_KIND

#: The instance kinds a cluster's status lists (the contracts own the words).
INSTANCE_KINDS: tuple[str, ...] = (GATEWAY_KIND, SIDECAR_KIND, *SERVICE_KINDS)
UNHEALTHY = 7  # exit code: an instance NACKs, is stale or gone, or nothing compiles
FORMATS = ("table", "yaml", "json")
HEADERS = ("CLUSTER", "KIND", "INSTANCE", "STATE", "APPLIED", "WANTED", "LAST CONTACT", "ERROR")
#: Versions are digests; this many characters tell them apart on a terminal.
SHORT_VERSION = 12


@dataclass(frozen=True)
class ClusterStatus:
    """One cluster's status body, as the server sent it, under its ``ORG/CLUSTER`` name."""

    name: str
    body: Mapping[str, Any]

    def instances(self, kinds: Iterable[str]) -> list[Mapping[str, Any]]:
        wanted = set(kinds)
        return [i for i in self.body.get("instances") or [] if i.get("kind") in wanted]

    def compile_errors(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in (self.body.get("compileErrors") or {}).items()}

    def policy_errors(self) -> list[str]:
        """What compiles but cannot be enforced as written (the server's messages)."""
        return [str(e.get("message", "")) for e in self.body.get("policyErrors") or []]

    def warnings(self) -> list[str]:
        """What was accepted but cannot work as written (a reference to an object
        the cluster does not have); shown, never a failing exit."""
        return [str(w.get("message", "")) for w in self.body.get("warnings") or []]


def instance_state(instance: Mapping[str, Any]) -> str:
    """STALE, DISCONNECTED, NACK, ACK or APPLYING, the worst first."""
    if instance.get("stale"):
        return "STALE"
    if not instance.get("connected"):
        return "DISCONNECTED"
    if instance.get("upToDate"):
        return "ACK"
    if instance.get("lastResult") == "NACK":
        return "NACK"
    return "APPLYING"


FAILING_STATES = frozenset({"STALE", "DISCONNECTED", "NACK"})


def failing(clusters: Sequence[ClusterStatus], kinds: Iterable[str]) -> bool:
    """Whether the exit code must be :data:`UNHEALTHY`."""
    kinds = tuple(kinds)
    return any(
        c.compile_errors() or any(instance_state(i) in FAILING_STATES for i in c.instances(kinds))
        for c in clusters
    )


def _short(version: Any) -> str:
    return str(version)[:SHORT_VERSION] if version else "-"


def _row(cluster: ClusterStatus, instance: Mapping[str, Any], now: datetime) -> list[str]:
    kind = str(instance.get("kind", ""))
    wanted = (cluster.body.get("desiredVersions") or {}).get(kind)
    contact = instance.get("lastContactTime")
    state = instance_state(instance)
    # An error is shown while it explains the state: not after a later ACK.
    error = str(instance.get("lastError") or "") if state != "ACK" else ""
    return [
        cluster.name,
        kind,
        str(instance.get("instance", "")),
        state,
        _short(instance.get("appliedVersion")),
        _short(wanted),
        f"{age(contact, now)} ago" if isinstance(contact, str) else "never",
        " ".join(error.split()),
    ]


def render_table(clusters: Sequence[ClusterStatus], kinds: Iterable[str], now: datetime) -> str:
    kinds = tuple(kinds)
    rows = [_row(c, i, now) for c in clusters for i in c.instances(kinds)]
    out = table(rows, HEADERS) if rows else "No instance has subscribed.\n"
    for cluster in clusters:
        for kind, error in cluster.compile_errors().items():
            out += f"{cluster.name}: the {kind} snapshot does not compile: {error}\n"
        for message in cluster.policy_errors():
            out += f"{cluster.name}: not enforced as written: {message}\n"
        for message in cluster.warnings():
            out += f"{cluster.name}: warning: {message}\n"
        mesh_ca = cluster.body.get("meshCa") or {}
        if mesh_ca.get("phase", "idle") != "idle":  # once rotated
            out += f"{cluster.name}: {describe_mesh_ca(mesh_ca, now)}\n"
    return out


def render_data(clusters: Sequence[ClusterStatus], kinds: Iterable[str], fmt: str) -> str:
    """The status bodies (instances filtered by kind) as JSON or YAML, for programs."""
    kinds = tuple(kinds)
    data = {
        "clusters": [{**c.body, "instances": c.instances(kinds)} for c in clusters],
        "healthy": not failing(clusters, kinds),
    }
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    return yaml.safe_dump(data, sort_keys=False)


def check_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    unknown = [k for k in kinds if k not in INSTANCE_KINDS]
    if unknown:
        raise MeshctlError(
            f"--kind must be one of {', '.join(INSTANCE_KINDS)}, not {unknown[0]!r}", Exit.USAGE
        )
    return tuple(kinds) or INSTANCE_KINDS


def cluster_names(client: ApiClient, cluster: str | None, organization: str | None) -> list[str]:
    """``ORG/CLUSTER`` names: the one asked for, or every cluster of the organization."""
    if cluster is not None:
        org, sep, name = cluster.partition("/")
        if not sep and organization:
            org, name = organization, cluster
        if not org or not name or "/" in name:
            raise MeshctlError("--cluster must be ORG/CLUSTER", Exit.USAGE)
        return [f"{org}/{name}"]
    if not organization:
        raise MeshctlError(
            "meshctl status needs --cluster ORG/CLUSTER, or an organization "
            "(--org, or meshctl config set-profile --organization)",
            Exit.USAGE,
        )
    kind = require_kind("cluster")
    parents = resolve_parents(kind, {"organization": organization})
    try:
        return [
            f"{organization}/{str(c['fqn']).rsplit('/', 1)[-1]}"
            for c in list_objects(client, kind, parents)
        ]
    except ApiFailure as exc:
        raise refine(exc, None) from None


def fetch(client: ApiClient, names: Sequence[str]) -> list[ClusterStatus]:
    out = []
    for name in names:
        org, cluster = name.split("/", 1)
        ref = parse_fqn(f"organizations/{org}/clusters/{cluster}")
        try:
            out.append(ClusterStatus(name, client.get(ref.path + "/status")))
        except ApiFailure as exc:
            raise refine(exc, ref) from None
    return out


def now() -> datetime:
    return datetime.now(UTC)


def status(
    ctx: typer.Context,
    cluster: Annotated[
        str | None,
        typer.Option("--cluster", help="ORG/CLUSTER (default: every cluster of the organization)."),
    ] = None,
    org: Annotated[
        str | None,
        typer.Option("--org", "--organization", help="Organization (default: profile's)."),
    ] = None,
    kind: Annotated[
        list[str] | None,
        typer.Option("--kind", help=f"Only instances of this kind ({', '.join(INSTANCE_KINDS)})."),
    ] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table, yaml or json.")] = "table",
) -> None:
    """Each instance's applied and wanted version, ACK/NACK and last contact
    (exit 7 when one NACKs, is stale or gone)."""
    state = state_of(ctx)
    fmt = check_format(output, FORMATS)
    kinds = check_kinds(kind or [])
    _, profile = state.load()
    with state.client() as client:
        clusters = fetch(client, cluster_names(client, cluster, org or profile.organization))
    if fmt == "table":
        typer.echo(render_table(clusters, kinds, now()), nl=False)
    else:
        typer.echo(render_data(clusters, kinds, fmt), nl=False)
    if failing(clusters, kinds):
        raise typer.Exit(UNHEALTHY)
