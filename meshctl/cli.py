"""``meshctl``: the command-line client of the meshplane management plane.

Command wiring only: profiles live in ``config``, the REST client in
``client``, resource operations in ``ops``, logins in ``login``. Every
failure is raised as ``MeshctlError`` and printed by ``main`` as exactly one
line ``error: ...`` with its documented exit code (``errors.Exit``).

Imports are what ``meshctl get`` needs: a command group with a module of its
own is a row of :data:`LAZY_COMMANDS` (imported when run, :mod:`meshctl.lazy`),
and what only one command uses (an editor, a login flow) is imported in it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from meshctl.client import ApiClient
from meshctl.config import Profile, load_config
from meshctl.confirm import confirm
from meshctl.entry import version_line
from meshctl.errors import ApiFailure, Exit, MeshctlError
from meshctl.kinds import (
    Kind,
    Ref,
    describe_policy,
    is_policy_word,
    parse_fqn,
    policy_path,
    require_kind,
    resolve_parents,
)
from meshctl.lazy import lazy_group
from meshctl.manifest import Manifest, dump, policy_manifest, read_manifests, to_manifest
from meshctl.ops import (
    apply_manifest,
    delete_all,
    empty_policy,
    get_object,
    list_objects,
    needs_confirmation,
    refine,
)
from meshctl.output import check_format as _check_format
from meshctl.output import render_objects
from meshctl.state import State, state_of
from meshplane.kinds_contract import Kind as KindName
from meshplane.secret_file import write_secret

# Command groups and commands in modules of their own: name -> "module:attribute"
# of a typer.Typer (a group) or of a command's function, imported only when the
# command runs (or --help lists it). A new group is a row here, never an import
# at the top of this module (meshctl.lazy).
LAZY_COMMANDS: dict[str, str] = {
    "approvals": "meshctl.approvals:app",
    "diag": "meshctl.diag:app",
    "gateway": "meshctl.gateway:app",
    "sidecar": "meshctl.sidecar:app",
    "proxy": "meshctl.proxy:app",
    "status": "meshctl.status:status",
    "rotate": "meshctl.rotate:app",
}

#: ``meshctl get workloads``: not a kind, a cluster's view (:mod:`meshctl.workloads`).
WORKLOAD_WORDS = frozenset({"workload", "workloads"})

app = typer.Typer(
    cls=lazy_group(LAZY_COMMANDS),
    add_completion=False,
    no_args_is_help=True,
    help="Manage a meshplane management plane: log in, then get, apply, edit and delete "
    "organizations, tenants, workspaces, clusters, users, teams, roles and policies.",
    context_settings={"help_option_names": ["-h", "--help"]},
    # A crash report must never print local variables: they may hold tokens.
    pretty_exceptions_show_locals=False,
)
config_app = typer.Typer(help="Profiles: servers, defaults and stored credentials.")
clusters_app = typer.Typer(help="Cluster-specific operations.")
app.add_typer(config_app, name="config")
app.add_typer(clusters_app, name="clusters")


def _print_version(value: bool) -> None:
    """``--version`` among other options (alone, meshctl.entry answers it before this module)."""
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    profile: Annotated[
        str | None,
        typer.Option("--profile", "-p", envvar="MESHCTL_PROFILE", help="Profile to use."),
    ] = None,
    server: Annotated[
        str | None,
        typer.Option(
            "--server", envvar="MESHCTL_SERVER", help="Server URL for this run (not saved)."
        ),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log each request line to stderr.")
    ] = False,
    _version: Annotated[
        bool,
        typer.Option(
            "--version", is_eager=True, callback=_print_version, help="Print the version."
        ),
    ] = False,
) -> None:
    ctx.obj = State(profile, server, verbose)


# ---- option types shared by the resource commands ----------------------------------------

OrgOpt = Annotated[
    str | None, typer.Option("--org", "--organization", help="Organization (default: profile's).")
]
TenantOpt = Annotated[str | None, typer.Option("--tenant", help="Tenant (default: profile's).")]
WorkspaceOpt = Annotated[str | None, typer.Option("--workspace", help="Workspace.")]
GroupOpt = Annotated[
    str | None, typer.Option("--security-group", help="Security group (settings, policies).")
]
ClusterOpt = Annotated[
    str | None, typer.Option("--cluster", help="Cluster (service accounts, traffic policies).")
]
OutputOpt = Annotated[str, typer.Option("--output", "-o", help="table, yaml or json.")]
FilesOpt = Annotated[
    list[str] | None, typer.Option("--filename", "-f", help="Manifest file, or - for stdin.")
]


def _ref(
    state: State,
    what: str,
    name: str | None,
    *,
    org: str | None,
    tenant: str | None,
    workspace: str | None,
    cluster: str | None,
    group: str | None = None,
) -> tuple[Kind, Ref | None, tuple[tuple[Kind, str], ...]]:
    """KIND [NAME] or FQN -> (kind, the object or None for a listing, its parents)."""
    if "/" in what:
        if name is not None:
            raise MeshctlError("give either an FQN or KIND NAME, not both", Exit.USAGE)
        ref = parse_fqn(what)
        return ref.kind, ref, ref.parents
    kind = require_kind(what)
    _, profile = state.load()
    names = {
        "organization": org or profile.organization,
        "tenant": tenant or profile.tenant,
        "workspace": workspace,
        "securityGroup": group,
        "cluster": cluster,
    }
    parents = resolve_parents(kind, names)
    return kind, (Ref(kind, name, parents) if name else None), parents


def _read_files(files: list[str]) -> list[Manifest]:
    """Parse every file before any write, so a typo in the last file changes nothing."""
    manifests: list[Manifest] = []
    for name in files:
        if name == "-":
            text, source = sys.stdin.read(), "<stdin>"
        else:
            try:
                text = Path(name).read_text(encoding="utf-8")
            except OSError as exc:
                raise MeshctlError(f"cannot read {name}: {exc.strerror}", Exit.USAGE) from exc
            source = name
        manifests.extend(read_manifests(text, source))
    if not manifests:
        raise MeshctlError("the manifest files hold no objects", Exit.USAGE)
    return manifests


# ---- login / logout ------------------------------------------------------------------------


# The options of `login`, one alias each so its signature reads at once.
_LoginServer = Annotated[
    str | None, typer.Option("--server", help="Management plane URL; saved in the profile.")
]
_LoginUsername = Annotated[
    str | None,
    typer.Option("--username", "-u", help="Local user (org users: ORG/NAME): Basic login."),
]
_LoginPasswordStdin = Annotated[
    bool, typer.Option("--password-stdin", help="Read the password from stdin.")
]
_LoginUseDeviceCode = Annotated[
    bool, typer.Option("--use-device-code", help="RFC 8628 device login (no browser here).")
]
_LoginUseTokenExchange = Annotated[
    bool,
    typer.Option("--use-token-exchange", help="Exchange an identity-provider access token."),
]
_LoginAccessToken = Annotated[
    str | None,
    typer.Option(
        "--access-token",
        help="The provider's access token for --use-token-exchange; - reads stdin.",
    ),
]
_LoginOrganization = Annotated[
    str | None, typer.Option("--organization", "--org", help="Organization (device login).")
]
_LoginTenant = Annotated[
    str | None,
    typer.Option("--tenant", help="Device login: saved as the profile's default tenant."),
]
_LoginOidcName = Annotated[
    str | None, typer.Option("--oidc-name", help="OIDC configuration name, when several.")
]
_LoginNoBrowser = Annotated[
    bool, typer.Option("--no-browser", help="Print the login URL instead of opening it.")
]
_LoginCallbackPort = Annotated[
    int, typer.Option("--callback-port", help="Loopback port for the browser flow (0: any).")
]
_LoginTimeout = Annotated[
    float, typer.Option("--timeout", help="Seconds to wait for the browser login.")
]


@app.command()
def login(  # noqa: PLR0917 - typer maps options to parameters
    ctx: typer.Context,
    server: _LoginServer = None,
    username: _LoginUsername = None,
    password_stdin: _LoginPasswordStdin = False,
    use_device_code: _LoginUseDeviceCode = False,
    use_token_exchange: _LoginUseTokenExchange = False,
    access_token: _LoginAccessToken = None,
    organization: _LoginOrganization = None,
    tenant: _LoginTenant = None,
    oidc_name: _LoginOidcName = None,
    no_browser: _LoginNoBrowser = False,
    callback_port: _LoginCallbackPort = 0,
    timeout: _LoginTimeout = 300.0,
) -> None:
    """Log in and store a platform token in the profile (browser flow by default)."""
    state = state_of(ctx)
    config, profile = state.load()
    if server:
        profile.server = server.rstrip("/")
    elif state.server:
        profile.server = state.server.rstrip("/")
    _check_login_modes(
        username=username,
        password_stdin=password_stdin,
        use_device_code=use_device_code,
        use_token_exchange=use_token_exchange,
        access_token=access_token,
    )

    from meshctl import login as login_mod  # noqa: PLC0415 - the login flows: login only

    def say(text: str) -> None:
        typer.echo(text, err=True)

    if username is not None:
        password = _login_password(username, password_stdin=password_stdin)
        creds = login_mod.login_basic(profile, username, password, verbose=state.verbose)
    elif use_token_exchange:
        token = _login_access_token(access_token)
        creds = login_mod.login_token_exchange(profile, token, oidc_name, verbose=state.verbose)
    elif use_device_code:
        creds = login_mod.login_device(
            profile,
            functools.partial(_login_scope, profile, organization, tenant),
            oidc_name,
            verbose=state.verbose,
            say=say,
        )
    else:
        creds = login_mod.login_browser(
            profile,
            oidc_name,
            verbose=state.verbose,
            open_browser=not no_browser,
            timeout=timeout,
            port=callback_port,
            say=say,
        )
    profile.credentials = creds
    config.save()
    who = f" as {creds.subject}" if creds.subject else ""
    typer.echo(f"Logged in to {profile.server}{who} (profile {profile.name}).")


def _check_login_modes(
    *,
    username: str | None,
    password_stdin: bool,
    use_device_code: bool,
    use_token_exchange: bool,
    access_token: str | None,
) -> None:
    """One login mode at a time, and each mode's options only with it."""
    modes = [username is not None, use_device_code, use_token_exchange]
    if sum(modes) > 1:
        raise MeshctlError(
            "choose one of --username, --use-device-code and --use-token-exchange", Exit.USAGE
        )
    if password_stdin and username is None:
        raise MeshctlError("--password-stdin needs --username", Exit.USAGE)
    if access_token is not None and not use_token_exchange:
        raise MeshctlError("--access-token needs --use-token-exchange", Exit.USAGE)


def _login_password(username: str, *, password_stdin: bool) -> str:
    """The password from stdin (--password-stdin) or a terminal prompt; never an argument."""
    import getpass  # noqa: PLC0415 - login only

    from meshctl import login as login_mod  # noqa: PLC0415 - login only

    if password_stdin:
        return login_mod.read_secret_from_stdin("password")
    if sys.stdin.isatty():
        return getpass.getpass(f"Password for {username}: ")
    raise MeshctlError(
        "no terminal to ask for the password; pipe it with --password-stdin", Exit.USAGE
    )


def _login_access_token(access_token: str | None) -> str:
    """The identity provider's access token to exchange (``-``: read from stdin)."""
    if not access_token:
        raise MeshctlError("--use-token-exchange needs --access-token TOKEN", Exit.USAGE)
    if access_token == "-":  # noqa: S105 - "-" means stdin
        from meshctl import login as login_mod  # noqa: PLC0415 - login only

        return login_mod.read_secret_from_stdin("access token")
    return access_token


def _login_scope(profile: Profile, organization: str | None, tenant: str | None) -> tuple[str, str]:
    """The device login's organization and tenant (asked when not given), saved in the profile."""
    org = organization or _ask("Organization", profile.organization)
    ten = tenant or _ask("Tenant", profile.tenant)
    if not org or not ten:
        raise MeshctlError("device login needs an organization and a tenant", Exit.USAGE)
    profile.organization, profile.tenant = org, ten
    return org, ten


def _ask(label: str, default: str | None) -> str:
    """One line from the user (stderr prompt, so stdout stays clean); default on empty."""
    hint = f" [{default}]" if default else ""
    typer.echo(f"{label}{hint}: ", err=True, nl=False)
    answer = sys.stdin.readline().strip()
    return answer or (default or "")


@app.command()
def logout(ctx: typer.Context) -> None:
    """Forget the stored token of the profile."""
    config, profile = state_of(ctx).load()
    profile.credentials = None
    config.save()
    typer.echo(f"Logged out (profile {profile.name}).")


# ---- config ----------------------------------------------------------------------------------


@config_app.command("view")
def config_view(ctx: typer.Context) -> None:
    """Show the configuration with tokens masked."""
    config, _ = state_of(ctx).load()
    typer.echo(f"# {config.path}")
    typer.echo(yaml.safe_dump(config.to_dict(masked=True), sort_keys=False), nl=False)


@config_app.command("set-profile")
def config_set_profile(  # noqa: PLR0917 - typer maps options to parameters
    name: str,
    server: Annotated[str | None, typer.Option("--server")] = None,
    organization: Annotated[str | None, typer.Option("--organization", "--org")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant")] = None,
    ca_file: Annotated[str | None, typer.Option("--ca-file", help="CA bundle (PEM).")] = None,
    insecure_skip_verify: Annotated[
        bool | None, typer.Option("--insecure-skip-verify/--verify-tls")
    ] = None,
    use: Annotated[bool, typer.Option("--use", help="Also make it the current profile.")] = False,
) -> None:
    """Create or change a profile."""
    config = load_config()
    profile = config.profile(name)
    if server is not None:
        profile.server = server.rstrip("/")
    if organization is not None:
        profile.organization = organization or None
    if tenant is not None:
        profile.tenant = tenant or None
    if ca_file is not None:
        profile.ca_file = ca_file or None
    if insecure_skip_verify is not None:
        profile.insecure_skip_verify = insecure_skip_verify
    if use or len(config.profiles) == 1:
        config.current = name
    config.save()
    typer.echo(f"Profile {name} saved.")


@config_app.command("use-profile")
def config_use_profile(name: str) -> None:
    """Make NAME the current profile."""
    config = load_config()
    if name not in config.profiles:
        raise MeshctlError(
            f"no profile {name!r}; create it with meshctl config set-profile {name}",
            Exit.NOT_FOUND,
        )
    config.current = name
    config.save()
    typer.echo(f"Using profile {name}.")


@config_app.command("get-profiles")
def config_get_profiles() -> None:
    """List profiles; * marks the current one."""
    config = load_config()
    now = datetime.now(UTC)
    for name, profile in sorted(config.profiles.items()):
        creds = profile.credentials
        status = "not logged in"
        if creds is not None:
            status = "expired" if creds.expired(now) else f"logged in ({creds.method})"
        mark = "*" if name == config.current else " "
        typer.echo(f"{mark} {name}\t{profile.server or '-'}\t{status}")


@config_app.command("delete-profile")
def config_delete_profile(name: str) -> None:
    """Remove a profile and its credentials."""
    config = load_config()
    if config.profiles.pop(name, None) is None:
        raise MeshctlError(f"no profile {name!r}", Exit.NOT_FOUND)
    config.save()
    typer.echo(f"Profile {name} deleted.")


# ---- get / apply / delete / edit --------------------------------------------------------------


@app.command()
def get(  # noqa: PLR0917 - typer maps options to parameters
    ctx: typer.Context,
    what: Annotated[str, typer.Argument(help="KIND (cluster, tenant, ...), FQN, or policy.")],
    name: Annotated[
        str | None, typer.Argument(help="Object name (policy: its FQN, root or rbac).")
    ] = None,
    org: OrgOpt = None,
    tenant: TenantOpt = None,
    workspace: WorkspaceOpt = None,
    group: GroupOpt = None,
    cluster: ClusterOpt = None,
    output: OutputOpt = "table",
    selector: Annotated[
        str, typer.Option("--selector", "-l", help="Label selector k=v,k2 (lists).")
    ] = "",
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="At most this many (lists).")
    ] = None,
    chunk_size: Annotated[
        int, typer.Option("--chunk-size", min=1, max=1000, help="Page size of list requests.")
    ] = 1000,
    fetch_workloads: Annotated[
        bool, typer.Option("--fetch-workloads", help="Clusters: include workloads (expensive).")
    ] = False,
) -> None:
    """Show one object, or list a kind under its parent; ``workloads`` lists a
    cluster's sidecars (``--cluster``)."""
    state = state_of(ctx)
    fmt = _check_format(output)
    if what.lower() in WORKLOAD_WORDS:
        from meshctl import workloads  # noqa: PLC0415 - only when asked (fast `get`)

        _, profile = state.load()
        where = workloads.names(org or profile.organization, cluster)
        with state.client() as client:
            typer.echo(workloads.show(client, *where, fmt), nl=False)
        return
    if is_policy_word(what):
        if name is None:
            raise MeshctlError("meshctl get policy TARGET (an FQN, root or rbac)", Exit.USAGE)
        with state.client() as client:
            try:
                policy = client.get(policy_path(name))
            except ApiFailure as exc:
                raise refine(exc, None) from None
        typer.echo(
            dump(
                [policy_manifest(name, policy)], "json" if fmt == "json" else "yaml", as_list=False
            ),
            nl=False,
        )
        return
    kind, ref, parents = _ref(
        state, what, name, org=org, tenant=tenant, workspace=workspace, cluster=cluster, group=group
    )
    with state.client() as client:
        if ref is not None:
            obj = get_object(client, ref, {"fetchWorkloads": "true"} if fetch_workloads else None)
            typer.echo(render_objects(kind, [obj], fmt, as_list=False), nl=False)
            return
        try:
            objects = list(
                list_objects(
                    client,
                    kind,
                    parents,
                    label_selector=selector,
                    limit=limit,
                    extra={"fetchWorkloads": "true"} if fetch_workloads else None,
                    page_size=chunk_size,
                )
            )
        except ApiFailure as exc:
            raise refine(exc, None) from None
    typer.echo(render_objects(kind, objects, fmt, as_list=True), nl=False)


@app.command()
def apply(
    ctx: typer.Context,
    filename: FilesOpt = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="yaml or json: print the results.")
    ] = None,
) -> None:
    """Create or update the objects of manifest files (etags are sent on every update)."""
    state = state_of(ctx)
    if not filename:
        raise MeshctlError("meshctl apply needs -f FILE (or -f - for stdin)", Exit.USAGE)
    if output is not None:
        _check_format(output, ("yaml", "json"))
    manifests = _read_files(filename)
    results = []
    with state.client() as client:
        for m in manifests:
            result = apply_manifest(client, m)
            results.append(result)
            if output is None:
                note = ""
                if (
                    result.action == "created"
                    and m.ref is not None
                    and m.ref.kind.name == KindName.CLUSTER
                ):
                    org = m.ref.parent_names().get("organization", "ORG")
                    note = (
                        " (get its install template with meshctl clusters install-template "
                        f"{org} {m.ref.name})"
                    )
                typer.echo(f"{m.describe()} {result.action}{note}")
    if output is not None:
        docs = [
            to_manifest(r.manifest.ref.kind, r.obj)
            if r.manifest.ref is not None
            else policy_manifest(r.manifest.policy_target or "root", r.obj)
            for r in results
        ]
        typer.echo(dump(docs, output, as_list=len(docs) != 1), nl=False)


@app.command()
def delete(  # noqa: PLR0917 - typer maps options to parameters
    ctx: typer.Context,
    what: Annotated[str | None, typer.Argument(help="KIND, FQN, or policy.")] = None,
    name: Annotated[str | None, typer.Argument(help="Object name.")] = None,
    filename: FilesOpt = None,
    org: OrgOpt = None,
    tenant: TenantOpt = None,
    workspace: WorkspaceOpt = None,
    group: GroupOpt = None,
    cluster: ClusterOpt = None,
    force: Annotated[
        bool, typer.Option("--force", help="Also delete protected objects below it.")
    ] = False,
    yes: Annotated[
        bool,
        typer.Option(
            "--yes", "-y", help="Delete organizations, clusters and objects with children unasked."
        ),
    ] = False,
) -> None:
    """Delete an object and everything below it (refused when protected, unless --force).

    An organization, a cluster or an object with children is deleted only
    once its name is typed on the terminal, or with --yes. ``-f FILE`` undoes
    ``apply -f FILE``: its objects are deleted (children first), then its
    access policies emptied (a policy always exists; it is emptied as a PUT
    may, not deleted). ``meshctl delete policy TARGET`` empties one policy.
    """
    state = state_of(ctx)
    refs: list[Ref] = []
    policies: list[str] = []
    if filename:
        if what is not None:
            raise MeshctlError("give either -f FILE or KIND NAME, not both", Exit.USAGE)
        for m in _read_files(filename):
            if m.ref is None:
                policies.append(m.policy_target or "root")
            else:
                refs.append(m.ref)
    elif what is not None and is_policy_word(what):
        if name is None:
            raise MeshctlError("meshctl delete policy TARGET (an FQN, root or rbac)", Exit.USAGE)
        policies.append(name)
    else:
        if what is None:
            raise MeshctlError("meshctl delete KIND NAME, FQN, or -f FILE", Exit.USAGE)
        _, ref, _ = _ref(
            state,
            what,
            name,
            org=org,
            tenant=tenant,
            workspace=workspace,
            cluster=cluster,
            group=group,
        )
        if ref is None:
            raise MeshctlError(f"meshctl delete {what} NAME: the name is required", Exit.USAGE)
        refs.append(ref)
    with state.client() as client:
        if not yes:
            confirm(
                [r for r in refs if needs_confirmation(client, r)],
                terminal=sys.stdin.isatty() and "-" not in (filename or ()),
                ask=lambda label: _ask(label, None),
                tell=lambda line: typer.echo(line, err=True),
            )
        for ref, outcome in delete_all(client, refs, force=force):
            done = "deleted" if outcome == "deleted" else "already gone (its parent is listed too)"
            typer.echo(f"{ref.describe()} {done}")
        deleted = {r.fqn for r in refs}
        for target in dict.fromkeys(policies):
            if _under(target, deleted):  # went with its object
                typer.echo(f"{describe_policy(target)} already gone (its object is listed too)")
                continue
            typer.echo(f"{describe_policy(target)} {empty_policy(client, target)}")


def _under(target: str, fqns: set[str]) -> bool:
    """Whether ``target`` (a policy's FQN) is one of ``fqns`` or below one of them."""
    t = target.strip().strip("/")
    return any(t == f or t.startswith(f + "/") for f in fqns)


EDIT_HEADER = (
    "# Edit the object below and save; an empty file cancels.\n"
    "# metadata.etag must stay as read: if someone changed the object meanwhile,\n"
    "# the update is refused and nothing is lost.\n"
)


@app.command()
def edit(  # noqa: PLR0917 - typer maps options to parameters
    ctx: typer.Context,
    what: Annotated[str, typer.Argument(help="KIND, FQN, or policy.")],
    name: Annotated[str | None, typer.Argument(help="Object name (policy: FQN/root/rbac).")] = None,
    org: OrgOpt = None,
    tenant: TenantOpt = None,
    workspace: WorkspaceOpt = None,
    group: GroupOpt = None,
    cluster: ClusterOpt = None,
) -> None:
    """Open an object in $VISUAL/$EDITOR as YAML and update it with the etag it was read with."""
    state = state_of(ctx)
    with state.client() as client:
        if is_policy_word(what):
            if name is None:
                raise MeshctlError("meshctl edit policy TARGET (an FQN, root or rbac)", Exit.USAGE)
            doc = policy_manifest(name, client.get(policy_path(name)))
        else:
            kind, ref, _ = _ref(
                state,
                what,
                name,
                org=org,
                tenant=tenant,
                workspace=workspace,
                cluster=cluster,
                group=group,
            )
            if ref is None:
                raise MeshctlError(f"meshctl edit {what} NAME: the name is required", Exit.USAGE)
            doc = to_manifest(kind, get_object(client, ref))
        original = yaml.safe_dump(doc, sort_keys=False)
        edited = _run_editor(EDIT_HEADER + original)
        if edited is None:
            typer.echo("Edit cancelled, no changes made.")
            return
        try:
            action = _apply_edit(client, doc, edited)
        except MeshctlError as exc:
            # Never lose the user's work: keep the edited copy and say where it is.
            import tempfile  # noqa: PLC0415 - edit only

            fd, kept = tempfile.mkstemp(prefix="meshctl-edit-", suffix=".yaml")
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(edited)
            raise MeshctlError(
                f"{exc.message}; your edited copy is in {kept} (apply it with meshctl apply -f)",
                exc.exit_code,
            ) from None
        typer.echo(action)


def _apply_edit(client: ApiClient, doc: dict[str, Any], edited: str) -> str:
    """Validate the edited manifest against what was read, then PUT it with the read etag."""
    manifests = list(read_manifests(edited, "edited object"))
    if len(manifests) != 1:
        raise MeshctlError("the edited file must hold exactly one object", Exit.USAGE)
    m = manifests[0]
    metadata = doc["metadata"]
    same = (
        m.ref is not None and m.ref.fqn == metadata.get("fqn")
        if "fqn" in metadata
        else m.policy_target == metadata.get("target")
    )
    if not same:
        raise MeshctlError("edit cannot rename or move an object", Exit.USAGE)
    if yaml.safe_load(edited) == doc:
        return "Edit cancelled, no changes made."
    m = dataclasses.replace(m, etag=m.etag or metadata.get("etag"))
    result = apply_manifest(client, m)
    return f"{m.describe()} {'unchanged' if result.action == 'unchanged' else 'edited'}"


def _run_editor(text: str) -> str | None:
    """Run the user's editor on ``text``; None when the result is empty."""
    import shlex  # noqa: PLC0415 - edit only
    import subprocess  # noqa: PLC0415
    import tempfile  # noqa: PLC0415

    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    fd, path = tempfile.mkstemp(prefix="meshctl-edit-", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        try:
            code = subprocess.call([*shlex.split(editor), path])  # noqa: S603 - the user's editor
        except OSError as exc:
            raise MeshctlError(
                f"cannot run the editor {editor!r} ({exc.strerror}); set $EDITOR", Exit.USAGE
            ) from exc
        if code != 0:
            raise MeshctlError(f"the editor exited with status {code}; nothing changed", Exit.USAGE)
        result = Path(path).read_text(encoding="utf-8")
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    body = "\n".join(line for line in result.splitlines() if not line.lstrip().startswith("#"))
    return result if body.strip() else None


# ---- clusters --------------------------------------------------------------------------------


@clusters_app.command("install-template")
def install_template(
    ctx: typer.Context,
    organization: Annotated[str, typer.Argument(help="Organization name.")],
    cluster: Annotated[str, typer.Argument(help="Cluster name.")],
    file: Annotated[
        Path | None, typer.Option("--file", help="Write here (mode 0600) instead of stdout.")
    ] = None,
    output: Annotated[str, typer.Option("--output", "-o", help="yaml or json.")] = "yaml",
) -> None:
    """Fetch a fresh install template (mints a new agent API key; needs SET_POLICY on the org)."""
    state = state_of(ctx)
    fmt = _check_format(output, ("yaml", "json"))
    ref = parse_fqn(f"organizations/{organization}/clusters/{cluster}")
    with state.client() as client:
        try:
            obj = client.get(ref.path, {"includeInstallTemplate": "true"})
        except ApiFailure as exc:
            raise refine(exc, ref) from None
    template: Any = obj.get("installTemplate") if isinstance(obj, dict) else None
    if not isinstance(template, dict):
        raise MeshctlError(
            f"the management plane returned {ref.fqn} without installTemplate", Exit.API_ERROR
        )
    text = (
        json.dumps(template, indent=2) + "\n"
        if fmt == "json"
        else yaml.safe_dump(template, sort_keys=False)
    )
    if file is None:
        typer.echo(text, nl=False)
        return
    write_secret(file, text)
    typer.echo(
        f"Wrote the install template of {ref.fqn} to {file}; it holds the cluster's API key, "
        "keep it secret.",
        err=True,
    )


def main() -> None:
    """Entry point: run the app, print any MeshctlError as one line, exit with its code."""
    try:
        app(prog_name="meshctl")
    except MeshctlError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        sys.exit(int(exc.exit_code))
    except KeyboardInterrupt:
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
