"""ExtAuthzPolicy: one JWT policy the group's ext_authz servers enforce.

Stored as one entry of the ext_authz file's ``policies`` list without its
``name`` (the compiler names it per cluster, :mod:`mgmt_api.compiler.extauthz`)
and validated with ext_authz's own loader, so the API accepts exactly what
the servers load. Secrets (HMAC keys, private JWKS) are write-only: a GET
shows a fingerprint marker instead, and an update that sends a marker back
keeps the stored secret it stands for (:mod:`mgmt_api.compiler.key_material`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from meshplane.config_error import ConfigError
from meshplane.kinds_contract import Kind
from mgmt_api.compiler import extauthz as extauthz_compiler
from mgmt_api.compiler import key_material
from mgmt_api.errors import invalid
from mgmt_api.kinds.base import Behaviour, KindDef, RenderEnv, Write, render_common
from mgmt_api.schemas.resources import Meta
from mgmt_api.store import repo

# An HS256 key shorter than the hash is refused (RFC 7518 section 3.2).
MIN_HMAC_SECRET_BYTES = 32
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


class ExtAuthzPolicyBehaviour(Behaviour):
    def merge_update(self, stored: repo.Resource, write: Write) -> None:
        """The redaction markers a GET returned, put back as the stored secrets."""
        try:
            restored = key_material.restore(write.spec, stored.spec)
        except key_material.UnknownMarker as exc:
            raise invalid(
                f"{write.prefix}.{exc.field}",
                "is a redacted value that matches none of this policy's stored secrets; "
                "send the secret itself",
            ) from None
        write.spec.clear()
        write.spec.update(restored)

    def validate(self, write: Write) -> None:
        spec, prefix = write.spec, write.prefix
        marker_field = key_material.first_marker(spec)
        if marker_field is not None:
            # A create (or a body copied from another policy): storing the
            # marker would make it the secret.
            raise invalid(
                f"{prefix}.{marker_field}",
                "is a redacted value; send the secret itself (a marker is only "
                "accepted on an update of the policy it was read from)",
            )
        for i, entry in enumerate(((spec.get("jwt") or {}).get("keys")) or []):
            value = ((entry or {}).get("hmacSecret") or {}).get("value")
            if isinstance(value, str) and len(value.encode()) < MIN_HMAC_SECRET_BYTES:
                # It also keeps the unkeyed fingerprint that REST shows
                # instead of the secret from helping anyone with READ guess it.
                raise invalid(
                    f"{prefix}.jwt.keys[{i}].hmacSecret.value",
                    f"an HMAC secret must be at least {MIN_HMAC_SECRET_BYTES} bytes "
                    "(RFC 7518 section 3.2); generate one, e.g. `openssl rand -base64 32`",
                )
        try:
            extauthz_compiler.validate_policy({k: v for k, v in spec.items() if k in _POLICY_KEYS})
        except ConfigError as exc:
            raise invalid(f"{prefix}.{exc.field}" if exc.field else prefix, exc.message) from None

    def render(self, res: repo.Resource, env: RenderEnv) -> dict[str, Any]:
        return key_material.redact(render_common(res))


KIND = KindDef(Kind.EXT_AUTHZ_POLICY, ExtAuthzPolicy, behaviour=ExtAuthzPolicyBehaviour())
