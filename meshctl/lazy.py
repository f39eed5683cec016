"""Commands imported only when they run, so each meshctl call pays for its own imports.

A command group whose module is heavy (``diag`` pulls in grpc and the Envoy
protos, ``gateway`` the JWT and control-plane code) is named in the root's
table (``meshctl.cli.LAZY_COMMANDS``: name -> ``"module:attribute"`` of its
``typer.Typer``, or of the function of a single command) instead of being
imported at the top of ``meshctl.cli``.
Its module is imported when the command is run, or when ``--help`` lists it;
``meshctl get`` and ``meshctl --version`` never import it
(``tests/meshctl/test_start_imports.py``).

A module named in the table keeps to itself: ``meshctl.cli`` and the modules
every command uses (``client``, ``config``, ``kinds``, ``ops``, ``output``)
never import it at their top.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

import typer
from typer import _click
from typer.core import TyperGroup


def lazy_group(table: Mapping[str, str]) -> type[TyperGroup]:
    """A root group class that also offers the commands of ``table`` (name ->
    ``"module:attribute"`` of a ``typer.Typer`` or a command function), imported on first use."""

    class LazyGroup(TyperGroup):
        def list_commands(self, ctx: _click.Context) -> list[str]:
            return [*super().list_commands(ctx), *(n for n in table if n not in self.commands)]

        def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
            if cmd_name not in self.commands and cmd_name in table:
                self.commands[cmd_name] = _load(cmd_name, table[cmd_name])
            return super().get_command(ctx, cmd_name)

    return LazyGroup


def _load(name: str, target: str) -> _click.Command:
    """The command ``name`` from ``"module:attribute"``: a ``typer.Typer`` is a
    group of its commands (as ``add_typer`` makes it, even with one command),
    a function is one command."""
    module, _, attribute = target.partition(":")
    found = getattr(importlib.import_module(module), attribute)
    if isinstance(found, typer.Typer):
        command: _click.Command = typer.main.get_group(found)
    else:
        single = typer.Typer(add_completion=False)
        single.command(name)(found)
        command = typer.main.get_command(single)
    command.name = name
    return command
