"""The ``meshctl`` entry point: ``meshctl --version`` answers before the CLI is imported.

Printing the version needs neither typer nor any command, so it costs only
the interpreter's start; everything else goes to :func:`meshctl.cli.main`.
"""

from __future__ import annotations

import sys

#: The distribution meshctl ships in: its version is meshctl's.
DISTRIBUTION = "meshplane"


def version_line() -> str:
    """``meshctl VERSION``, the installed distribution's version (pyproject.toml)."""
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415 - --version only

    try:
        return f"meshctl {version(DISTRIBUTION)}"
    except PackageNotFoundError:
        return "meshctl (version unknown: not installed)"


def main() -> None:
    """Run meshctl with ``sys.argv``."""
    if sys.argv[1:] == ["--version"]:
        print(version_line())
        return
    from meshctl.cli import main as run  # noqa: PLC0415 - not for --version

    run()
