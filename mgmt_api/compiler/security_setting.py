"""The SecuritySetting resource (spec §2.7) as the API accepts it.

The reference's ``AuthorizationSettings`` is ``{mode, serviceAccounts[],
http}``: ``mode: CUSTOM`` means "the workloads may be called by exactly these
service accounts", given as ``ns/sa``, ``ns/*`` or ``./*``. The shared
resource schemas (:mod:`mgmt_api.schemas.resources`) model ``mode`` and
``http``; this module adds ``serviceAccounts``, and the kind table
(:mod:`mgmt_api.kinds`) serves SecuritySetting with this model. Which values
go together (``serviceAccounts`` exactly with ``CUSTOM``) is checked by
:mod:`mgmt_api.service.validation`, so the 400 names the field.

``mode`` and ``serviceAccounts`` govern workload-to-workload (mTLS identity)
authorization, which the platform stores and returns but does not enforce
itself; ``http.external`` is the ext_authz server that Envoy calls, with any
mode, and is what the compiler and ``envoyconfig`` read.
"""

from __future__ import annotations

from pydantic import Field

from mgmt_api.schemas import resources as m


class AuthorizationSettings(m.AuthorizationSettings):
    service_accounts: list[str] | None = Field(
        default=None,
        max_length=256,
        description="With mode CUSTOM only: the service accounts allowed to call the "
        "group's workloads, as ns/sa, ns/* or ./* (. is the workload's namespace).",
    )


class SecuritySetting(m.SecuritySetting):
    """A security group's settings (spec §2.7); only authorization is modelled."""

    authorization: AuthorizationSettings | None = None
