"""meshctl imports only what a command uses: ``--version`` next to nothing,
``get`` neither grpc, protobuf, JWT nor the modules of the other command
groups (``meshctl.lazy``). No timing here: the figure is
``bench/meshctl_start.py``'s. The modules are read from the real process's
``-X importtime`` report, against the suite's real mgmt-api.
"""

from __future__ import annotations

import subprocess
import sys

import typer
from typer.core import TyperGroup

from meshctl.cli import LAZY_COMMANDS, app
from meshctl.entry import version_line
from tests.meshctl.conftest import REPO, Meshctl, unique

# Never needed to print a version or read objects: the RPC and proto stacks,
# JWT and crypto, metrics, and every command module in a row of LAZY_COMMANDS.
HEAVY = (
    "grpc",
    "google.protobuf",
    "jwt",
    "cryptography",
    "prometheus_client",
    "meshctl.login",
    "meshctl.oauth",
    *(target.partition(":")[0] for target in LAZY_COMMANDS.values()),
)


def imported(stderr: str) -> set[str]:
    """The modules a process imported, from its ``-X importtime`` lines."""
    return {
        line.rpartition("|")[2].strip()
        for line in stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }


def heavy(modules: set[str]) -> set[str]:
    return {m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY)}


def test_version_imports_neither_the_cli_nor_typer() -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "meshctl", "--version"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
        timeout=60,
    )
    assert done.stdout == version_line() + "\n"
    assert done.stdout.startswith("meshctl 0.") or "version unknown" in done.stdout
    modules = imported(done.stderr)
    assert "meshctl.entry" in modules, "the report was read"
    assert not modules & {"meshctl.cli", "typer", "yaml", "pydantic"}, modules
    assert not heavy(modules)


def test_get_imports_none_of_the_other_command_groups(shared_admin: Meshctl) -> None:
    org = unique("imports")
    shared_admin.ok("apply", "-f", "-", input=f"kind: Organization\nmetadata: {{name: {org}}}\n")
    done = shared_admin.run("get", "organizations", env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("NAME") and org in done.stdout
    modules = imported(done.stderr)
    assert {"meshctl.cli", "meshctl.client"} <= modules, "the report was read"
    assert not heavy(modules), sorted(heavy(modules))


def test_every_lazy_command_loads_as_a_group_or_command() -> None:
    """Each row names a real Typer or function; groups stay groups (one
    subcommand included), and none offers shell-completion options."""
    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    with typer.Context(root) as ctx:
        assert set(LAZY_COMMANDS) <= set(root.list_commands(ctx))
        for name in LAZY_COMMANDS:
            command = root.get_command(ctx, name)
            assert command is not None and command.name == name
            assert not [p for p in command.params if "completion" in (p.name or "")], name
    gateway = root.get_command(ctx, "gateway")
    assert isinstance(gateway, TyperGroup)
    assert gateway.list_commands(ctx) == ["bootstrap"]
