"""The commands the README and docs/meshctl.md show: the one extraction that
tests/docs/test_doc_commands.py parses and tests/e2e/test_run_command.py runs.

A code block's lines are joined (a trailing ``\\`` continues one); a command
also counts after ``until``, ``&&``, ``|``, ``$(``. Backticked spans of the
prose count too (``whole`` is False for them). A code block preceded by a
``<!-- not-run: WHY -->`` line is parsed but never run against the demo:
:func:`not_run` says why.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

import typer.main
from typer import _click

from meshctl.cli import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", ROOT / "docs" / "meshctl.md")
#: Where a shell line stops being the command: a pipe, a redirect, a list, a comment.
STOPS = {"|", "||", "&&", ";", ">", "<", "2>", "2>&1", ")", "#"}
#: What may come before a command in a code block: the line's start, a prompt, a
#: shell operator or keyword (not prose, nor an error message that names a command).
COMMAND_START = r"(?:^\s*(?:\$\s+)?|\$\(|[|&;]\s*|\b(?:until|while|do|then|if|!)\s+)"
SYNOPSIS = re.compile(r"\[|\.\.\.|\w\|\w|\|$")
NOT_RUN = re.compile(r"^\s*<!--\s*not-run:\s*(.+?)\s*-->\s*$")


def code_lines(text: str) -> Iterator[tuple[int, str, str | None]]:
    """(first line number, the shell line with continuations joined, why its
    block is not run or None) for each line of each code block."""
    in_code, pending, start, marked, previous = False, "", 0, None, ""
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            if not in_code:
                found = NOT_RUN.match(previous)
                marked = found.group(1) if found else None
            in_code, pending = not in_code, ""
        elif in_code:
            if not pending:
                start = number
            pending += line.rstrip("\\").strip() + " "
            if not line.rstrip().endswith("\\"):
                yield start, pending, marked
                pending = ""
        if line.strip():
            previous = line


def commands(text: str, program: str) -> Iterator[tuple[int, str, bool]]:
    """(line number, the command from ``program`` on, whether it is a whole example:
    in a code block, not a span of the prose) for each mention."""
    in_code = False
    blocks = {start: line for start, line, _ in code_lines(text)}
    for number, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif in_code and number in blocks:
            pending = blocks[number]
            for found in re.finditer(rf"{COMMAND_START}{re.escape(program)} ", pending):
                yield number, pending[found.end() - len(program) - 1 :].strip(), True
        elif not in_code:
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


def concrete(command: str, whole: bool) -> bool:
    """Whether ``command`` (``meshctl ...``) is one to run: no synopsis (quoted
    text aside), meshctl's parser takes it whole, and a prose span names more
    than a command's path (``meshctl apply`` is a name, not an example)."""
    argv = words(command)[1:]
    if SYNOPSIS.search(re.sub(r"'[^']*'", "''", command)) or "--help" in argv:
        return False
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            parse_meshctl(argv)
            _, rest = meshctl_command(argv)
    except (_click.exceptions.UsageError, AssertionError):
        return False
    return whole or bool(rest)


def runnable(page: Path) -> list[tuple[str, str]]:
    """(where, the shell line) of each concrete meshctl example of ``page`` to run:
    a code-block line not marked not-run, holding a complete command (no
    synopsis), and on the README also a complete command its prose names."""
    text = page.read_text()
    where = str(page.relative_to(ROOT))
    out: dict[int, tuple[str, str]] = {}
    lines = {start: (line, marked) for start, line, marked in code_lines(text)}
    for number, command, whole in commands(text, "meshctl"):
        if not concrete(command, whole):
            continue
        if whole and lines[number][1] is None:
            out[number] = (f"{where}:{number}", lines[number][0].strip())
        elif not whole and page.name == "README.md":
            out[number] = (f"{where}:{number}", command)
    return list(out.values())


def not_run(page: Path) -> list[tuple[int, str]]:
    """(line, why) of each code block line ``page`` marks as not run against the demo."""
    return [(start, why) for start, _, why in code_lines(page.read_text()) if why is not None]
