"""``meshctl rotate``: start a rotation of a cluster's credentials (today its mesh CA).

Imported only when run (a row of ``meshctl.cli.LAZY_COMMANDS``).
"""

from __future__ import annotations

import json
from typing import Annotated

import typer
import yaml

from meshctl import meshca, status
from meshctl.output import check_format
from meshctl.state import state_of

app = typer.Typer(help="Rotate a cluster's credentials.", no_args_is_help=True)


@app.command("meshca")
def rotate_meshca(
    ctx: typer.Context,
    cluster: Annotated[str, typer.Option("--cluster", help="ORG/CLUSTER, or CLUSTER with --org.")],
    org: Annotated[
        str | None,
        typer.Option("--org", "--organization", help="Organization (default: profile's)."),
    ] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="table, yaml or json.")] = "table",
) -> None:
    """Start a rotation of the cluster's mesh CA (needs SET_POLICY on the cluster;
    exit 5 while one runs). Watch it with meshctl status."""
    state = state_of(ctx)
    fmt = check_format(output, status.FORMATS)
    _, profile = state.load()
    with state.client() as client:
        (name,) = status.cluster_names(client, cluster, org or profile.organization)
        section = meshca.rotate(client, name)
    if fmt == "table":
        typer.echo(f"{name}: {meshca.describe(section, status.now())}")
    elif fmt == "json":
        typer.echo(json.dumps(section, indent=2))
    else:
        typer.echo(yaml.safe_dump(section, sort_keys=False), nl=False)
