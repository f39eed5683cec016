"""``meshctl proxy``: diagnostics of a workload's proxies through the cluster's agent.

Every command is one call to ``/v2/organizations/{org}/clusters/{cluster}/
proxytools/...`` (docs/api.md, "Proxy diagnostics"); the management plane
routes it to the cluster's agent, which asks the proxies. A workload is
``--namespace NS WORKLOAD``; ``--instance`` narrows it to one proxy
(default: every instance, each answered separately).

- ``meshctl proxy stats WORKLOAD [--filter RE] [--used-only] [--upstream]``
- ``meshctl proxy config-dump WORKLOAD [--resource R] [--mask M] [--include-eds]``
- ``meshctl proxy loggers WORKLOAD [--set LEVEL | --set LOGGER=LEVEL ...]``
- ``meshctl proxy logs WORKLOAD [-f] [--tail N] [--since SECONDS]``
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer
import yaml

from meshctl.errors import Exit, MeshctlError
from meshctl.state import state_of

app = typer.Typer(
    help="Proxy diagnostics (stats, config dump, logger levels, logs) through the cluster agent.",
    no_args_is_help=True,
)

Workload = Annotated[str, typer.Argument(help="The workload (deployment, VM group).")]
Namespace = Annotated[str, typer.Option("--namespace", "-n", help="The workload's namespace.")]
Cluster = Annotated[str, typer.Option("--cluster", help="The cluster the workload runs in.")]
Org = Annotated[
    str | None, typer.Option("--org", "--organization", help="Organization (default: profile's).")
]
Instance = Annotated[
    str, typer.Option("--instance", help="One instance (pod); default: every instance.")
]
Output = Annotated[str, typer.Option("--output", "-o", help="json or yaml.")]


def _path(ctx: typer.Context, org: str | None, cluster: str, endpoint: str) -> str:
    _, profile = state_of(ctx).load()
    organization = org or profile.organization
    if not organization:
        raise MeshctlError("give --org (or a default organization in the profile)", Exit.USAGE)
    return f"/v2/organizations/{organization}/clusters/{cluster}/proxytools/{endpoint}"


def _print(result: Any, output: str) -> None:
    if output == "json":
        typer.echo(json.dumps(result, indent=2))
    elif output == "yaml":
        typer.echo(yaml.safe_dump(result, sort_keys=False), nl=False)
    else:
        raise MeshctlError("--output must be json or yaml", Exit.USAGE)


def _call(ctx: typer.Context, method: str, path: str, body: dict[str, Any], output: str) -> None:
    with state_of(ctx).client() as client:
        _print(client.request(method, path, json=body), output)


@app.command("stats")
def stats(  # noqa: PLR0917 - typer maps options to parameters
    ctx: typer.Context,
    workload: Workload,
    namespace: Namespace,
    cluster: Cluster,
    org: Org = None,
    instance: Instance = "",
    filter_: Annotated[str, typer.Option("--filter", help="RE2 regex over stat names.")] = "",
    used_only: Annotated[bool, typer.Option("--used-only", help="Only used stats.")] = False,
    server_info: Annotated[
        bool, typer.Option("--server-info", help="Also Envoy's /server_info (long).")
    ] = False,
    upstream: Annotated[
        bool, typer.Option("--upstream", help="Upstream cluster stats (/clusters) instead.")
    ] = False,
    output: Output = "json",
) -> None:
    """Stats (with --server-info, Envoy's server info too; with --upstream, upstream
    cluster stats instead)."""
    body: dict[str, Any] = {"namespace": namespace, "workload": workload, "instance": instance}
    if upstream:
        _call(ctx, "POST", _path(ctx, org, cluster, "clusterstats"), body, output)
        return
    body.update({"filter": filter_, "usedOnly": used_only, "includeServerInfo": server_info})
    _call(ctx, "POST", _path(ctx, org, cluster, "serverstats"), body, output)


@app.command("config-dump")
def config_dump(  # noqa: PLR0917
    ctx: typer.Context,
    workload: Workload,
    namespace: Namespace,
    cluster: Cluster,
    org: Org = None,
    instance: Instance = "",
    resource: Annotated[str, typer.Option("--resource", help="e.g. dynamic_active_clusters")] = "",
    mask: Annotated[str, typer.Option("--mask", help="A field mask, e.g. cluster.name")] = "",
    include_eds: Annotated[bool, typer.Option("--include-eds", help="With EDS.")] = False,
    output: Output = "json",
) -> None:
    """The proxies' config dump (secrets redacted by the agent)."""
    body = {
        "namespace": namespace,
        "workload": workload,
        "instance": instance,
        "resource": resource,
        "mask": mask,
        "includeEds": include_eds,
    }
    _call(ctx, "POST", _path(ctx, org, cluster, "configdump"), body, output)


@app.command("loggers")
def loggers(  # noqa: PLR0917
    ctx: typer.Context,
    workload: Workload,
    namespace: Namespace,
    cluster: Cluster,
    org: Org = None,
    instance: Instance = "",
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="LEVEL for every logger, or LOGGER=LEVEL (repeatable)."),
    ] = None,
    output: Output = "json",
) -> None:
    """Show the logger levels, or set them (--set debug, --set upstream=trace)."""
    body: dict[str, Any] = {"namespace": namespace, "workload": workload, "instance": instance}
    path = _path(ctx, org, cluster, "loggerlevels")
    if not set_:
        _call(ctx, "POST", path, body, output)
        return
    named = [s for s in set_ if "=" in s]
    if named and len(named) != len(set_):
        raise MeshctlError("--set takes LEVEL once, or LOGGER=LEVEL items", Exit.USAGE)
    if named:
        body["loggers"] = dict(item.split("=", 1) for item in named)
    elif len(set_) == 1:
        body["level"] = set_[0]
    else:
        raise MeshctlError("--set LEVEL can be given once", Exit.USAGE)
    _call(ctx, "PUT", path, body, output)


@app.command("logs")
def logs(  # noqa: PLR0917
    ctx: typer.Context,
    workload: Workload,
    namespace: Namespace,
    cluster: Cluster,
    org: Org = None,
    instance: Instance = "",
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep streaming.")] = False,
    tail: Annotated[int | None, typer.Option("--tail", help="Last N lines first.")] = None,
    since: Annotated[int | None, typer.Option("--since", help="Only the last N seconds.")] = None,
) -> None:
    """The proxies' logs, each line prefixed with its instance (Ctrl-C stops following)."""
    body: dict[str, Any] = {
        "namespace": namespace,
        "workload": workload,
        "instance": instance,
        "follow": follow,
    }
    if tail is not None:
        body["tailLines"] = tail
    if since is not None:
        body["sinceSeconds"] = since
    path = _path(ctx, org, cluster, "streamlogs")
    with state_of(ctx).client() as client:
        for line in client.stream("POST", path, json=body):
            if "error" in line:
                where = line.get("instance", "stream")
                typer.echo(f"{where}: error: {line['error']['message']}", err=True)
                continue
            typer.echo(f"{line['instance']}: {line['line']}")
