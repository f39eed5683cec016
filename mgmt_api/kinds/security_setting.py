"""SecuritySetting: a security group's authorization settings.

The reference's ``AuthorizationSettings`` is ``{mode, serviceAccounts[],
http}``. ``mode: CUSTOM`` means "the workloads may be called by exactly these
service accounts", given as ``ns/sa``, ``ns/*`` or ``./*`` (``.``: the
workload's namespace). ``mode`` and ``serviceAccounts`` govern
workload-to-workload (mTLS identity) authorization, which the platform stores
and returns but does not enforce itself; ``http.external`` is the ext_authz
server Envoy calls, with any mode, and is what the compiler and the gateway
config read. ``mode: DISABLED`` renders routes that skip ext_authz.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from meshplane.kinds_contract import Kind
from mgmt_api import fqn as fqnmod
from mgmt_api.domain.uris import check_grpc_uri
from mgmt_api.errors import invalid
from mgmt_api.kinds.base import Behaviour, KindDef, Write
from mgmt_api.schemas.base import ApiModel
from mgmt_api.schemas.resources import Meta

AuthorizationMode = Literal[
    "UNSET", "NAMESPACE", "GROUP", "WORKSPACE", "CLUSTER", "DISABLED", "CUSTOM", "RULES"
]

# ``ns/sa``, ``ns/*``, ``./sa`` or ``./*`` (``.``: the setting's own namespaces).
_SERVICE_ACCOUNT = re.compile(
    r"^(\.|[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)/(\*|[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)$"
)


class ExternalAuthorization(ApiModel):
    uri: str = Field(description="grpc://host:port of the ext_authz server.")
    policy: str | None = Field(
        default=None,
        description="Name of an ExtAuthzPolicy of the same security group to enforce.",
    )
    include_request_headers_in_check: list[str] | None = None


class HttpAuthorization(ApiModel):
    external: ExternalAuthorization | None = None


class AuthorizationSettings(ApiModel):
    mode: AuthorizationMode = "UNSET"
    http: HttpAuthorization | None = None
    service_accounts: list[str] | None = Field(
        default=None,
        max_length=256,
        description="With mode CUSTOM only: the service accounts allowed to call the "
        "group's workloads, as ns/sa, ns/* or ./* (. is the workload's namespace).",
    )


class SecuritySetting(Meta):
    """A security group's settings; only authorization is modelled."""

    authorization: AuthorizationSettings | None = None


class SecuritySettingBehaviour(Behaviour):
    def validate(self, write: Write) -> None:
        prefix = write.prefix
        authz = write.spec.get("authorization") or {}
        external = (authz.get("http") or {}).get("external")
        if external is not None:
            check_grpc_uri(f"{prefix}.authorization.http.external.uri", external.get("uri", ""))
            if external.get("policy") is not None:
                fqnmod.validate_name(
                    external["policy"], f"{prefix}.authorization.http.external.policy"
                )
        accounts = authz.get("serviceAccounts")
        field = f"{prefix}.authorization.serviceAccounts"
        if authz.get("mode") == "CUSTOM":
            if not accounts:
                raise invalid(field, "is required when mode is CUSTOM (ns/sa, ns/* or ./*)")
        elif accounts is not None:
            raise invalid(field, "is only allowed with mode CUSTOM")
        seen: set[str] = set()
        for i, account in enumerate(accounts or []):
            if not _SERVICE_ACCOUNT.match(account):
                raise invalid(
                    f"{field}[{i}]",
                    f"{account!r} is not ns/sa, ns/*, ./sa or ./* (DNS-1123 names)",
                )
            if account in seen:
                raise invalid(f"{field}[{i}]", f"{account!r} is listed twice")
            seen.add(account)


KIND = KindDef(Kind.SECURITY_SETTING, SecuritySetting, behaviour=SecuritySettingBehaviour())
