"""Inventory reports that arrive over the tunnel, stored as the REST report would be.

The body is the JSON of ``PUT .../clusters/{cluster}/inventory``, validated
by the same model and stored by the same service as the agent's own
principal, so both channels produce the same cluster record, audit and
onboarding status. The REST endpoint stays for agents that post by hand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from pydantic import ValidationError
from sqlalchemy.engine import Engine

from mgmt_api.errors import ApiError
from mgmt_api.schemas.inventory import InventoryReport
from mgmt_api.service.authn import principal_for
from mgmt_api.service.inventory import InventoryService, agent_fqn
from mgmt_api.service.resources import CallContext
from mgmt_api.store.engine import read_tx
from mgmt_api.tunnel.hub import cluster_name


class TunnelInventory:
    def __init__(self, engine: Engine, stale_after: Callable[[], float]) -> None:
        self._engine = engine
        self._stale_after = stale_after

    def report_sync(self, organization: str, cluster: str, body: bytes) -> str:
        """Store the report; return "" or why it was refused (sent back to the agent)."""
        try:
            report = InventoryReport.model_validate_json(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            return f"invalid report: {where}: {first.get('msg', 'invalid')}"
        fqn = cluster_name(organization, cluster)
        try:
            with read_tx(self._engine) as conn:
                principal = principal_for(conn, agent_fqn(fqn), "serviceAccount")
            service = InventoryService(self._engine, self._stale_after())
            service.report(CallContext(principal, ""), fqn, report)
        except ApiError as exc:
            return exc.message
        return ""

    async def report(self, organization: str, cluster: str, body: bytes) -> str:
        return await asyncio.to_thread(self.report_sync, organization, cluster, body)
