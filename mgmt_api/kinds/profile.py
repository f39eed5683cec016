"""Profile: default and mandatory settings attached to organizations, tenants, workspaces.

``defaults`` may be overridden by later profiles or the object's own value;
``mandates`` never are (:mod:`mgmt_api.domain.blame`).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from meshplane.kinds_contract import Kind
from mgmt_api.kinds.base import KindDef
from mgmt_api.schemas.resources import Meta


class Profile(Meta):
    deletion_protection_enabled: bool | None = None
    defaults: dict[str, Any] | None = Field(default=None, description="Overridable settings.")
    mandates: dict[str, Any] | None = Field(default=None, description="Enforced settings.")


KIND = KindDef(Kind.PROFILE, Profile, protectable=True)
