"""Role: a named set of permission rules that access policies bind to subjects.

The built-in roles (``rbac/admin``, ``rbac/editor``, ...) are created at first
start and can be neither changed nor deleted, nor shadowed by a new role.
Changing a role's ``rules`` changes what every binding of it grants, so it
needs SET_POLICY on the role (:data:`RULES`), as binding it does.
"""

from __future__ import annotations

from meshplane.kinds_contract import Kind
from mgmt_api.domain import rbac
from mgmt_api.errors import ApiError, Code, already_exists, invalid
from mgmt_api.kinds.base import AccessGrant, Behaviour, KindDef, Write
from mgmt_api.schemas.resources import Meta, RoleRule


class Role(Meta):
    rules: list[RoleRule] | None = None


RULES = AccessGrant(
    "Role",
    "rules",
    "every binding of the role grants its rules",
    field=("rules",),
)


class RoleBehaviour(Behaviour):
    grants = (RULES,)

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
