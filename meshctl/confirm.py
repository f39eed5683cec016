"""Confirming a delete that takes more than one object with it.

Deleting an organization, a cluster or an object with children is
recursive and cannot be undone, so ``meshctl delete`` asks for it as the
console does: on a terminal, the object's name must be typed; without one
(a script, a pipe, ``-f -`` reading the manifest from stdin) it needs
``--yes``, and otherwise nothing is deleted. Which objects need it is
:func:`meshctl.ops.needs_confirmation`; this module only asks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from meshctl.errors import Exit, MeshctlError
from meshctl.kinds import Ref


def confirm(
    refs: Sequence[Ref],
    *,
    terminal: bool,
    ask: Callable[[str], str],
    tell: Callable[[str], None],
) -> None:
    """Have each of ``refs`` confirmed by its name typed at ``ask`` (a line,
    empty when the input ended); raise before anything is deleted when one is
    not, or when there is no ``terminal`` to ask on."""
    listed = {r.fqn for r in refs}
    # An object below another one asked for goes with it: ask for the top one only.
    refs = [r for r in dict.fromkeys(refs) if not any(r.fqn.startswith(f + "/") for f in listed)]
    if not refs:
        return
    if not terminal:
        named = ", ".join(r.describe() for r in refs)
        raise MeshctlError(
            f"deleting {named} also deletes everything below it: pass --yes to confirm"
            " (there is no terminal to ask on); nothing was deleted",
            Exit.USAGE,
        )
    for ref in refs:
        tell(f"{ref.describe()} and everything below it will be deleted.")
        if ask(f"Type its name ({ref.name}) to confirm").strip() != ref.name:
            raise MeshctlError(
                f"{ref.describe()}: the name was not typed; nothing was deleted", Exit.USAGE
            )
