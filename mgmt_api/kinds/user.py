"""User: a person, local (with a password) or synced from a directory.

``password`` is write-only: it is hashed (Argon2id) into the credentials
table, never into the spec. A synced user's ``sourceType`` (LDAP, AZURE) is
owned by the directory sync: an update cannot turn it into a local user.

The fields that decide who can log in as a user (its password, the email
and the OIDC binding label an OIDC login is matched by, its login name) need
SET_POLICY on the user to change (:data:`GRANTS`), not just WRITE: a writer
could otherwise take the account over.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from meshplane.kinds_contract import Kind
from mgmt_api.auth import passwords
from mgmt_api.errors import invalid
from mgmt_api.kinds.base import AccessGrant, Behaviour, KindDef, Write, WriteEnv, revived_by_create
from mgmt_api.schemas.resources import Meta
from mgmt_api.store import repo

SourceType = Literal["LDAP", "LOCAL", "AZURE", "MANUAL"]
_USER_OWNED_SOURCES = (None, "MANUAL", "LOCAL")
#: The label binding a user to an OIDC configuration (``mgmt_api.identity.user_mapping``).
OIDC_BINDING_LABEL = "identity.meshplane.io/oidc"

GRANTS = (
    revived_by_create("User"),
    AccessGrant(
        "User",
        "password",
        "the password logs in as the user",
        field=("password",),
        write_only=True,
    ),
    AccessGrant(
        "User",
        "email",
        "an OIDC login with this verified email becomes the user",
        field=("email",),
    ),
    AccessGrant(
        "User",
        f"labels.{OIDC_BINDING_LABEL}",
        "binds the user to an OIDC configuration, whose logins then become it",
        field=("labels", OIDC_BINDING_LABEL),
    ),
    AccessGrant(
        "User",
        "loginName",
        "the name the directory and people know the account by",
        field=("loginName",),
    ),
)


class User(Meta):
    login_name: str | None = Field(default=None, description="Changing it needs SET_POLICY.")
    first_name: str | None = None
    last_name: str | None = None
    email: str | None = Field(
        default=None, description="OIDC logins match it; changing it needs SET_POLICY."
    )
    source_type: SourceType | None = Field(default=None, description="Output only.")
    password: str | None = Field(
        default=None,
        description="Write-only. Sets the local password (needs SET_POLICY on the user).",
        json_schema_extra={"writeOnly": True},
    )


def _password(write: Write) -> str | None:
    password = getattr(write.body, "password", None)
    return password if isinstance(password, str) else None


class UserBehaviour(Behaviour):
    grants = GRANTS

    def validate(self, write: Write) -> None:
        write.spec.setdefault("sourceType", "MANUAL")
        password = _password(write)
        if password is not None and not (
            passwords.MIN_LENGTH <= len(password) <= passwords.MAX_LENGTH
        ):
            field = f"{write.prefix}.password" if write.creating else "password"
            raise invalid(
                field, f"must be {passwords.MIN_LENGTH} to {passwords.MAX_LENGTH} characters"
            )

    def merge_update(self, stored: repo.Resource, write: Write) -> None:
        if stored.spec.get("sourceType") not in _USER_OWNED_SOURCES:
            write.spec["sourceType"] = stored.spec["sourceType"]

    def after_write(self, env: WriteEnv, write: Write, res: repo.Resource) -> dict[str, Any]:
        password = _password(write)
        if password is not None:
            repo.set_password_hash(env.tx.conn, res.fqn, passwords.hash_password(password))
        return {}

    def audit_properties(self, write: Write) -> dict[str, bool]:
        return {} if write.creating else {"passwordChanged": _password(write) is not None}


KIND = KindDef(Kind.USER, User, behaviour=UserBehaviour())
