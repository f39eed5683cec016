"""ExtAuthzPolicy: one JWT policy the group's ext_authz servers enforce.

Stored as one entry of the ext_authz file's ``policies`` list without its
``name`` (the compiler names it per cluster, :mod:`mgmt_api.compiler.extauthz`)
and validated with ext_authz's own loader, so the API accepts exactly what
the servers load. Secrets (HMAC keys, private JWKS) are write-only
(:data:`SECRETS`): a GET shows a fingerprint marker instead, and an update
that sends a marker back keeps the stored secret it stands for
(:mod:`mgmt_api.compiler.key_material`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from meshplane.config_error import ConfigError
from meshplane.kinds_contract import Kind
from mgmt_api.compiler import extauthz as extauthz_compiler
from mgmt_api.compiler.key_material import EACH, MIN_HMAC_KEY_BYTES, Material, SecretField
from mgmt_api.errors import invalid
from mgmt_api.kinds.base import Behaviour, KindDef, Write
from mgmt_api.schemas.resources import Meta

_POLICY_KEYS = ("jwt", "pathClaim", "removeAuthorization", "claimsToHeaders")


class ExtAuthzPolicy(Meta):
    """One ext_authz JWT policy, in the schema of an entry of the ext_authz
    config file's ``policies`` list without ``name`` (the server names it)."""

    jwt: dict[str, Any] = Field(
        description="{algorithms, keys, leewaySeconds, issuer, audiences} as in docs/extauthz.md"
    )
    path_claim: dict[str, Any] | None = Field(default=None, description="{name, match}")
    remove_authorization: bool | None = None
    claims_to_headers: list[dict[str, Any]] | None = None


#: Every inline key of ``jwt.keys``: write-only (:mod:`mgmt_api.compiler.key_material`).
SECRETS = (
    SecretField(("jwt", "keys", EACH, "hmacSecret", "value"), Material.SECRET),
    SecretField(("jwt", "keys", EACH, "jwks", "value"), Material.KEY),
    SecretField(("jwt", "keys", EACH, "publicKeyPem", "value"), Material.KEY),
)


class ExtAuthzPolicyBehaviour(Behaviour):
    secrets = SECRETS

    def validate(self, write: Write) -> None:
        spec, prefix = write.spec, write.prefix
        for i, entry in enumerate(((spec.get("jwt") or {}).get("keys")) or []):
            value = ((entry or {}).get("hmacSecret") or {}).get("value")
            if isinstance(value, str) and len(value.encode()) < MIN_HMAC_KEY_BYTES:
                # It also keeps the unkeyed fingerprint that REST shows
                # instead of the secret from helping anyone with READ guess it.
                raise invalid(
                    f"{prefix}.jwt.keys[{i}].hmacSecret.value",
                    f"an HMAC secret must be at least {MIN_HMAC_KEY_BYTES} bytes "
                    "(RFC 7518 section 3.2); generate one, e.g. `openssl rand -base64 32`",
                )
        try:
            extauthz_compiler.validate_policy({k: v for k, v in spec.items() if k in _POLICY_KEYS})
        except ConfigError as exc:
            raise invalid(f"{prefix}.{exc.field}" if exc.field else prefix, exc.message) from None


KIND = KindDef(Kind.EXT_AUTHZ_POLICY, ExtAuthzPolicy, behaviour=ExtAuthzPolicyBehaviour())
