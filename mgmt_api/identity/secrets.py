"""Secrets referenced by the install config, never written in it.

A client secret or bind password in a YAML file ends up in Git, in Helm
values and in ``kubectl describe`` output, so the config only names *where*
the secret is: a file (a mounted Kubernetes secret) or an environment
variable. The value is read when it is used, so a rotated secret file is
picked up without a restart, and it travels in a ``Secret`` whose ``repr``
hides it, so a stray log line or traceback cannot leak it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


class SecretUnavailableError(Exception):
    """The referenced secret cannot be read right now (the message names where, not what)."""


class Secret:
    """A secret value that does not print itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The value, for the one call that needs it (an HTTP form field, an LDAP bind)."""
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


@dataclass(frozen=True, slots=True)
class SecretRef:
    """Where a secret lives: ``file`` (path) or ``env`` (variable name)."""

    kind: Literal["file", "env"]
    location: str

    def describe(self) -> str:
        """A loggable description of the location (never the value)."""
        return f"{self.kind}:{self.location}"

    def read(self) -> Secret:
        """Read the secret now; trailing newlines of a file are dropped."""
        if self.kind == "env":
            value = os.environ.get(self.location)
            if value is None or value == "":
                raise SecretUnavailableError(f"environment variable {self.location} is not set")
            return Secret(value)
        try:
            text = Path(self.location).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise SecretUnavailableError(
                f"cannot read secret file {self.location}: {exc.__class__.__name__}"
            ) from exc
        value = text.rstrip("\r\n")
        if not value:
            raise SecretUnavailableError(f"secret file {self.location} is empty")
        return Secret(value)
