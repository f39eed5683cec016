"""Every ``meshctl`` and ``scripts/run`` command the README and docs/meshctl.md show
is one the real parsers accept.

Commands are taken from code blocks (continued lines joined; a command after
``until``, ``&&``, ``|``, ``$(`` counted too) and from backticked spans in the
prose. A concrete example is parsed whole by meshctl's own click tree (the
root group, each subcommand, its options and arguments, nothing invoked). A
synopsis (``[--flag]``, ``a|b``, ``...``, ``ORG/CLUSTER`` placeholders with
brackets) cannot be parsed as one line, so its command path must exist and
every option it names must be an option of that command. Every
``scripts/run`` flag shown must be one of the orchestrator's parser
(:func:`demo.stack._parser`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer import _click

from demo.stack import _parser as run_parser
from meshctl.cli import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", ROOT / "docs" / "meshctl.md")
#: Where a shell line stops being the command: a pipe, a redirect, a list, a comment.
STOPS = {"|", "||", "&&", ";", ">", "<", "2>", "2>&1", ")", "#"}
#: What may come before a command in a code block: the line's start, a prompt, a
#: shell operator or keyword (not prose, nor an error message that names a command).
COMMAND_START = r"(?:^\s*(?:\$\s+)?|\$\(|[|&;]\s*|\b(?:until|while|do|then|if|!)\s+)"
SYNOPSIS = re.compile(r"\[|\.\.\.|\w\|\w|\|$")


def commands(text: str, program: str) -> Iterator[tuple[int, str, bool]]:
    """(line number, the command from ``program`` on, whether it is a whole example:
    in a code block, not a span of the prose) for each mention."""
    in_code, pending, start = False, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code, pending = not in_code, ""
            continue
        if in_code:
            if not pending:
                start = number
            pending += line.rstrip("\\").strip() + " "
            if line.rstrip().endswith("\\"):
                continue
            for found in re.finditer(rf"{COMMAND_START}{re.escape(program)} ", pending):
                yield start, pending[found.end() - len(program) - 1 :].strip(), True
            pending = ""
        else:
            for span in re.findall(r"`([^`]+)`", line):
                # A span names a command, maybe without its required arguments;
                # ``meshctl VERSION`` (a placeholder) is output, not a command.
                if span.startswith(program + " ") and not span.split()[1].isupper():
                    yield number, span, False


def words(command: str) -> list[str]:
    """The command's words up to the first shell operator."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars="|&;<>()")
    lexer.whitespace_split, lexer.commenters = True, "#"
    out: list[str] = []
    for word in lexer:
        if word in STOPS or set(word) <= set("|&;<>()"):
            break
        out.append(word)
    return out


def mentions(program: str) -> list[Any]:
    found = []
    for page in PAGES:
        for number, command, whole in commands(page.read_text(), program):
            where = f"{page.relative_to(ROOT)}:{number}"
            found.append(pytest.param(command, whole, id=f"{where}: {command[:60]}"))
    return found


def meshctl_command(argv: list[str]) -> tuple[_click.Command, list[str]]:
    """The (sub)command ``argv`` names, and the words after its name."""
    command: _click.Command = typer.main.get_command(app)
    rest = list(argv)
    while rest and hasattr(command, "resolve_command") and not rest[0].startswith("-"):
        ctx = command.make_context("meshctl", [], resilient_parsing=True)
        _, sub, rest = command.resolve_command(ctx, rest)
        assert sub is not None
        command = sub
    return command, rest


def parse_meshctl(argv: list[str]) -> None:
    """Parse ``argv`` with meshctl's click tree as a run would, invoking nothing."""
    root = typer.main.get_command(app)
    try:
        ctx = root.make_context("meshctl", list(argv))
        args = [*ctx._protected_args, *ctx.args]
        while args and hasattr(ctx.command, "resolve_command"):
            name, sub, rest = ctx.command.resolve_command(ctx, args)
            assert sub is not None and name is not None
            ctx = sub.make_context(name, rest, parent=ctx)
            args = [*ctx._protected_args, *ctx.args]
        assert not args, f"left over: {args}"
    except typer.Exit as done:  # --help
        assert done.exit_code == 0


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
