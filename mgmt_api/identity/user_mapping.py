"""Which user records an OIDC identity may become (pure; the SQL lookup is in ``sql_store``).

A login names a user by the token's ``oid``/``sub`` (or a verified email),
and those are chosen by the identity provider, not by us: a provider whose
users pick their own ``sub``, or a second configured provider, could
otherwise name ``users/admin`` or any other record. So a match counts only
when the record belongs to *this* OIDC configuration:

* **synced**: a user the directory sync created (``sourceType`` ``LDAP`` or
  ``AZURE``), of a source type in ``users.sourceTypes`` of the
  configuration, in one of ``users.organizations``. The default (first)
  configuration defaults to the pull sync's source type and organizations;
  other configurations to none;
* **bound**: a user an administrator created (``sourceType`` ``MANUAL``) and
  bound to the configuration with the label
  ``identity.meshplane.io/oidc: <configuration name>`` (for service
  principals of token exchange, or accounts outside the directory), **and
  that has no local password**: a local password account logs in with its
  password only, so a provider account can never become, say, the
  bootstrap ``users/admin``.

Synced matches win over bound ones, so a user bound in some other
organization cannot make a directory user's login ambiguous.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mgmt_api.identity.config import DIRECTORY_SOURCE_TYPES, OidcConfig
from mgmt_api.kinds.user import OIDC_BINDING_LABEL

BINDING_LABEL = OIDC_BINDING_LABEL  # setting it needs SET_POLICY on the user (kinds.user)
_ORG_PREFIX = "organizations/"


@dataclass(frozen=True, slots=True)
class LoginScope:
    """The users one OIDC configuration may log in as."""

    config_name: str
    source_types: frozenset[str]
    organizations: frozenset[str]

    @classmethod
    def of(cls, config: OidcConfig) -> LoginScope:
        return cls(
            config.name, frozenset(config.user_source_types), frozenset(config.user_organizations)
        )


def organization_of(user_fqn: str) -> str | None:
    """``acme`` for ``organizations/acme/users/x``; ``None`` for a global ``users/x``."""
    if not user_fqn.startswith(_ORG_PREFIX):
        return None
    return user_fqn[len(_ORG_PREFIX) :].split("/", 1)[0]


def match_kind(
    scope: LoginScope, user_fqn: str, spec: Mapping[str, Any], *, has_password: bool
) -> str | None:
    """``"synced"``, ``"bound"``, or ``None`` when this configuration may not log in as it."""
    source = spec.get("sourceType")
    if source in DIRECTORY_SOURCE_TYPES:
        org = organization_of(user_fqn)
        if source in scope.source_types and org is not None and org in scope.organizations:
            return "synced"
        return None
    labels = spec.get("labels")
    bound = isinstance(labels, Mapping) and labels.get(BINDING_LABEL) == scope.config_name
    if source in (None, "MANUAL") and bound and not has_password:
        return "bound"
    return None
