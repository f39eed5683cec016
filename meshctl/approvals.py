"""``meshctl approvals``: the approval workflow of spec section 4.5.

Every command works on an organization (``--org``) or, with ``--cluster``,
on one of its clusters; the paths are the spec's
``/v2/organizations/{org}[/clusters/{cluster}]/approvals[/suffix]``. Bodies
follow the reference shapes (``ApprovalPolicy{resource, mode}``,
``AccessRequest{resource, access{subject, permissions}}``,
``ResourceAndSubject{resource, subject}``,
``QueryPoliciesRequest{parent, types}``), built from flags, or taken whole
from ``-f FILE`` (YAML or JSON) when the server wants more than the flags
cover.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from meshctl.errors import ApiFailure, Exit, MeshctlError
from meshctl.state import state_of

app = typer.Typer(help="Approval policies and access requests (organization or cluster).")

MODES = ("UNRESTRICTED", "ALLOW_REQUESTED", "REQUIRE_APPROVAL")

OrgOpt = Annotated[
    str | None, typer.Option("--org", "--organization", help="Organization (default: profile's).")
]
ClusterOpt = Annotated[
    str | None, typer.Option("--cluster", help="Work on this cluster instead of the organization.")
]
FileOpt = Annotated[
    str | None, typer.Option("--filename", "-f", help="Request body (YAML/JSON file, - for stdin).")
]
SubjectOpt = Annotated[
    str | None, typer.Option("--subject", help="Subject FQN (user, team or service account).")
]
PermOpt = Annotated[
    list[str] | None, typer.Option("--permission", help="Permission to grant (repeatable).")
]
OutputOpt = Annotated[str, typer.Option("--output", "-o", help="yaml or json.")]


def _target(ctx: typer.Context, org: str | None, cluster: str | None) -> tuple[str, str]:
    """-> (resource FQN, REST prefix of its approvals)."""
    _, profile = state_of(ctx).load()
    organization = org or profile.organization
    if not organization:
        raise MeshctlError(
            "approvals need --org (or a default organization in the profile)", Exit.USAGE
        )
    fqn = f"organizations/{organization}" + (f"/clusters/{cluster}" if cluster else "")
    return fqn, f"/v2/{fqn}/approvals"


def _body_from_file(path: str | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        body = yaml.safe_load(text)
    except OSError as exc:
        raise MeshctlError(f"cannot read {path}: {exc.strerror}", Exit.USAGE) from exc
    except yaml.YAMLError as exc:
        raise MeshctlError(f"{path}: not valid YAML or JSON", Exit.USAGE) from exc
    if not isinstance(body, dict):
        raise MeshctlError(f"{path}: the request body must be a mapping", Exit.USAGE)
    return body


def _send(
    ctx: typer.Context,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    output: str,
    *,
    params: dict[str, str] | None = None,
    not_found_hint: str | None = None,
) -> None:
    if output not in ("yaml", "json"):
        raise MeshctlError("--output must be yaml or json", Exit.USAGE)
    with state_of(ctx).client() as client:
        try:
            result = client.request(method, path, json=body, params=params)
        except ApiFailure as exc:
            if exc.code_name == "NOT_FOUND" and not_found_hint:
                raise exc.with_hint(not_found_hint) from None
            raise
    if result == {}:
        typer.echo("ok")
    elif output == "json":
        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo(yaml.safe_dump(result, sort_keys=False), nl=False)


def _access_body(
    resource: str, subject: str | None, permissions: list[str] | None, file: str | None
) -> dict[str, Any]:
    body = _body_from_file(file)
    if body is not None:
        return body
    if not subject or not permissions:
        raise MeshctlError("give --subject and at least one --permission, or -f FILE", Exit.USAGE)
    return {"resource": resource, "access": {"subject": subject, "permissions": permissions}}


def _subject_body(resource: str, subject: str | None, file: str | None) -> dict[str, Any]:
    body = _body_from_file(file)
    if body is not None:
        return body
    if not subject:
        raise MeshctlError("give --subject, or -f FILE", Exit.USAGE)
    return {"resource": resource, "subject": subject}


@app.command("get")
def get_policy(
    ctx: typer.Context, org: OrgOpt = None, cluster: ClusterOpt = None, output: OutputOpt = "yaml"
) -> None:
    """Show the approval policy (GetPolicy)."""
    _, prefix = _target(ctx, org, cluster)
    _send(
        ctx,
        "GET",
        prefix,
        None,
        output,
        not_found_hint="no approval policy here; create one with meshctl approvals set-policy",
    )


@app.command("set-policy")
def set_policy(  # noqa: PLR0917 - typer maps options to parameters
    ctx: typer.Context,
    org: OrgOpt = None,
    cluster: ClusterOpt = None,
    mode: Annotated[str | None, typer.Option("--mode", help=", ".join(MODES))] = None,
    file: FileOpt = None,
    output: OutputOpt = "yaml",
) -> None:
    """Enable approval checks, replacing any existing policy settings (SetPolicy)."""
    resource, prefix = _target(ctx, org, cluster)
    body = _body_from_file(file)
    if body is None:
        if mode not in MODES:
            raise MeshctlError(f"--mode must be one of {', '.join(MODES)}", Exit.USAGE)
        body = {"resource": resource, "mode": mode}
    _send(ctx, "POST", prefix, body, output)


@app.command("delete-policy")
def delete_policy(
    ctx: typer.Context,
    org: OrgOpt = None,
    cluster: ClusterOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="Also delete protected internals.")
    ] = False,
    output: OutputOpt = "yaml",
) -> None:
    """Stop approval checks and revoke every approval (DeletePolicy)."""
    _, prefix = _target(ctx, org, cluster)
    _send(ctx, "DELETE", prefix, None, output, params={"force": "true"} if force else None)


@app.command("request")
def request_access(  # noqa: PLR0917 - typer maps options to parameters
    ctx: typer.Context,
    org: OrgOpt = None,
    cluster: ClusterOpt = None,
    subject: SubjectOpt = None,
    permission: PermOpt = None,
    file: FileOpt = None,
    output: OutputOpt = "yaml",
) -> None:
    """Ask for access (requested:add); allowed at once in ALLOW_REQUESTED mode."""
    resource, prefix = _target(ctx, org, cluster)
    _send(
        ctx,
        "POST",
        prefix + "/requested:add",
        _access_body(resource, subject, permission, file),
        output,
    )


@app.command("approve")
def approve(  # noqa: PLR0917 - typer maps options to parameters
    ctx: typer.Context,
    org: OrgOpt = None,
    cluster: ClusterOpt = None,
    subject: SubjectOpt = None,
    permission: PermOpt = None,
    file: FileOpt = None,
    output: OutputOpt = "yaml",
) -> None:
    """Approve a pending request (requested:approve); the permissions given are what is stored."""
    resource, prefix = _target(ctx, org, cluster)
    _send(
        ctx,
        "POST",
        prefix + "/requested:approve",
        _access_body(resource, subject, permission, file),
        output,
    )


@app.command("delete-request")
def delete_request(  # noqa: PLR0917 - typer maps options to parameters
    ctx: typer.Context,
    org: OrgOpt = None,
    cluster: ClusterOpt = None,
    subject: SubjectOpt = None,
    file: FileOpt = None,
    output: OutputOpt = "yaml",
) -> None:
    """Withdraw a pending request (requested:delete)."""
    resource, prefix = _target(ctx, org, cluster)
    _send(
        ctx,
        "POST",
        prefix + "/requested:delete",
        _subject_body(resource, subject, file),
        output,
        not_found_hint="no pending request for that subject; if it was already "
        "approved, use meshctl approvals delete-approved",
    )


@app.command("add-approved")
def add_approved(  # noqa: PLR0917 - typer maps options to parameters
    ctx: typer.Context,
    org: OrgOpt = None,
    cluster: ClusterOpt = None,
    subject: SubjectOpt = None,
    permission: PermOpt = None,
    file: FileOpt = None,
    output: OutputOpt = "yaml",
) -> None:
    """Grant access directly (approved:add)."""
    resource, prefix = _target(ctx, org, cluster)
    _send(
        ctx,
        "POST",
        prefix + "/approved:add",
        _access_body(resource, subject, permission, file),
        output,
    )


@app.command("delete-approved")
def delete_approved(  # noqa: PLR0917 - typer maps options to parameters
    ctx: typer.Context,
    org: OrgOpt = None,
    cluster: ClusterOpt = None,
    subject: SubjectOpt = None,
    file: FileOpt = None,
    output: OutputOpt = "yaml",
) -> None:
    """Revoke an approved access (approved:delete)."""
    resource, prefix = _target(ctx, org, cluster)
    _send(ctx, "POST", prefix + "/approved:delete", _subject_body(resource, subject, file), output)


@app.command("query")
def query(  # noqa: PLR0917 - typer maps options to parameters
    ctx: typer.Context,
    org: OrgOpt = None,
    cluster: ClusterOpt = None,
    types: Annotated[
        list[str] | None, typer.Option("--type", help="Resource type to query (repeatable).")
    ] = None,
    include_details: Annotated[bool, typer.Option("--include-details")] = False,
    file: FileOpt = None,
    output: OutputOpt = "yaml",
) -> None:
    """List the approval policies below the target (query)."""
    resource, prefix = _target(ctx, org, cluster)
    body = _body_from_file(file)
    if body is None:
        body = {"parent": resource, "types": types or [], "includeDetails": include_details}
    _send(ctx, "POST", prefix + "/query", body, output)
