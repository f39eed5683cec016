"""Role: a named set of permission rules that access policies bind to subjects.

The built-in roles (``rbac/admin``, ``rbac/editor``, ...) are created at first
start and can be neither changed nor deleted, nor shadowed by a new role.
"""

from __future__ import annotations

from meshplane.kinds_contract import Kind
from mgmt_api.domain import rbac
from mgmt_api.errors import ApiError, Code, already_exists, invalid
from mgmt_api.kinds.base import Behaviour, KindDef, Write
from mgmt_api.schemas.resources import Meta, RoleRule


class Role(Meta):
    rules: list[RoleRule] | None = None


class RoleBehaviour(Behaviour):
    def validate(self, write: Write) -> None:
        if write.creating and not write.spec.get("rules"):
            raise invalid(f"{write.prefix}.rules", "a role needs at least one rule")

    def check_writable(self, fqn: str, operation: str) -> None:
        if fqn not in rbac.BUILTIN_ROLES:
            return
        if operation == "create":
            raise already_exists(fqn)
        raise ApiError(
            Code.FAILED_PRECONDITION,
            f"{fqn} is a built-in role and cannot be "
            + ("changed" if operation == "update" else "deleted"),
        )


KIND = KindDef(Kind.ROLE, Role, behaviour=RoleBehaviour())
