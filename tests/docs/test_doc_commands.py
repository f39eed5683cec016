"""Every ``meshctl`` and ``scripts/run`` command the README and docs/meshctl.md show
is one the real parsers accept.

Commands are taken from code blocks (continued lines joined; a command after
``until``, ``&&``, ``|``, ``$(`` counted too) and from backticked spans in the
prose, by :mod:`tests.support.doc_commands` (tests/e2e/test_run_command.py
runs the concrete ones against the demo). A concrete example is parsed
whole by meshctl's own click tree (the
root group, each subcommand, its options and arguments, nothing invoked). A
synopsis (``[--flag]``, ``a|b``, ``...``, ``ORG/CLUSTER`` placeholders with
brackets) cannot be parsed as one line, so its command path must exist and
every option it names must be an option of that command. Every
``scripts/run`` flag shown must be one of the orchestrator's parser
(:func:`demo.stack._parser`).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from typer import _click

from demo.stack import _parser as run_parser
from tests.support.doc_commands import (
    PAGES,
    ROOT,
    SYNOPSIS,
    commands,
    meshctl_command,
    not_run,
    parse_meshctl,
    words,
)


def mentions(program: str) -> list[Any]:
    found = []
    for page in PAGES:
        for number, command, whole in commands(page.read_text(), program):
            where = f"{page.relative_to(ROOT)}:{number}"
            found.append(pytest.param(command, whole, id=f"{where}: {command[:60]}"))
    return found


def option_names(command: _click.Command) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)}


MESHCTL = mentions("meshctl")
RUN = mentions("scripts/run")


def test_the_pages_show_commands() -> None:
    assert len(MESHCTL) >= 40 and len(RUN) >= 3, (len(MESHCTL), len(RUN))


@pytest.mark.parametrize(("command", "whole"), MESHCTL)
def test_a_meshctl_command_shown_parses(command: str, whole: bool) -> None:
    argv = words(command)[1:]
    if argv == ["--version"]:
        return  # answered by meshctl/entry.py before the CLI (tests/meshctl)
    if SYNOPSIS.search(command) or not whole:
        target, rest = meshctl_command([w for w in argv if not w.startswith("[")])
        flags = {
            m.split("=")[0] for m in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", " ".join(rest))
        }
        unknown = flags - option_names(target) - {"--help"}
        assert not unknown, f"{command}: {sorted(unknown)} not options of {target.name}"
    else:
        parse_meshctl(argv)


@pytest.mark.parametrize(("command", "whole"), RUN)
def test_every_scripts_run_flag_shown_exists(command: str, whole: bool) -> None:
    known = set(run_parser()._option_string_actions)
    shown = {w.split("=")[0] for w in words(command)[1:] if w.startswith("-")}
    assert shown <= known, f"{command}: {sorted(shown - known)} is no flag of scripts/run"
    if whole and not SYNOPSIS.search(command):
        run_parser().parse_args([w for w in words(command)[1:] if w not in {"-h", "--help"}])


def test_the_checks_refuse_what_the_parsers_refuse() -> None:
    """The checks can fail: an unknown option, a missing argument, an unknown command."""
    for bad in (["get", "clusters", "--no-such"], ["edit"], ["no-such-command"]):
        with pytest.raises(_click.exceptions.UsageError):
            parse_meshctl(bad)
    target, _ = meshctl_command(["status", "--no-such", "X"])
    assert target.name == "status" and "--no-such" not in option_names(target)
    assert list(commands("```sh\necho meshctl get x\nmeshctl get \\\n  y\n```\n", "meshctl")) == [
        (3, "meshctl get y", True)
    ]


def test_each_example_not_run_says_why() -> None:
    """The ``<!-- not-run: WHY -->`` marks: few, each with a reason."""
    marked = [(page.name, line, why) for page in PAGES for line, why in not_run(page)]
    assert len(marked) <= 4, marked
    assert all(len(why.split()) >= 3 for _, _, why in marked), marked
