"""A child process that ends with its parent: the kernel's parent-death signal.

Linux sends ``PR_SET_PDEATHSIG``'s signal to a process when the thread that
started it dies, so a supervisor killed outright (SIGKILL, the OOM killer)
does not leave its children serving. Two kinds of child use it: a spawned
worker of ours calls :func:`die_with_parent` first thing; a foreign binary
(the sidecar agent's Envoy) is started through :func:`tied_command`, which
runs this file as a script to set the signal and then exec the binary in the
same process. Standard library only, so the script runs in an isolated
interpreter (``-I -S``) in a few milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGTERM) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux).

    The caller then checks that the parent is still the expected one: it may
    have died before this call.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def tied_command(args: list[str]) -> list[str]:
    """``args`` as a command whose process gets SIGTERM when this one dies.

    Nothing runs between fork and exec (subprocess may use vfork or
    posix_spawn): the signal is set after the exec of an isolated interpreter
    running this file, which then execs ``args`` keeping its pid, so the
    caller signals and waits on the binary itself.
    """
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()), *args]


def _exec_tied(argv: list[str]) -> None:
    """The script: set the signal, give up if the parent (argv[1]) is already gone,
    then exec argv[2:]."""
    die_with_parent(signal.SIGTERM)
    if os.getppid() != int(argv[1]):
        sys.exit(1)
    os.execv(argv[2], argv[2:])  # noqa: S606 - the caller's command, by design


if __name__ == "__main__":
    _exec_tied(sys.argv)
