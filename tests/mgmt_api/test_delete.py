"""Recursive delete, deletion protection and force."""

from __future__ import annotations

import json

import httpx
import sqlalchemy as sa

from mgmt_api.domain import mesh_ca
from mgmt_api.service.mesh_ca import MeshCaStore
from mgmt_api.store import repo, tables
from mgmt_api.store.engine import create_engine, write_tx
from mgmt_api.store.uow import UnitOfWork
from tests.mgmt_api.harness import MgmtServer, err, ok

#: Specs of the objects seeded straight into the store, as the API would store them.
SEEDED_SPECS = {"Tenant": {}, "Workspace": {"namespaceSelector": {"names": ["*/ns"]}}}


def _tree(admin: httpx.Client, org: str) -> None:
    base = f"/v2/organizations/{org}"
    ok(admin.post(f"{base}/tenants", json={"name": "t", "tenant": {}}))
    ok(
        admin.post(
            f"{base}/tenants/t/workspaces",
            json={"name": "w", "workspace": {"namespaceSelector": {"names": ["*/ns"]}}},
        )
    )
    ok(
        admin.post(
            f"{base}/tenants/t/workspaces/w/securitygroups",
            json={"name": "g", "securityGroup": {"configMode": "BRIDGED"}},
        )
    )
    ok(admin.post(f"{base}/clusters", json={"name": "c", "cluster": {}}))


def test_protected_descendant_refuses_and_force_deletes(admin: httpx.Client, org: str) -> None:
    _tree(admin, org)
    g_path = f"/v2/organizations/{org}/tenants/t/workspaces/w/securitygroups/g"
    g = ok(admin.get(g_path))
    ok(admin.put(g_path, json={**g, "deletionProtectionEnabled": True}))
    body = err(admin.delete(f"/v2/organizations/{org}"), 400, "FAILED_PRECONDITION")
    assert f"organizations/{org}/tenants/t/workspaces/w/securitygroups/g" in body["message"]
    # nothing was deleted
    ok(admin.get(g_path))
    ok(admin.get(f"/v2/organizations/{org}/clusters/c"))
    err(admin.delete(f"/v2/organizations/{org}/tenants/t"), 400, "FAILED_PRECONDITION")
    ok(admin.delete(f"/v2/organizations/{org}", params={"force": "true"}))
    err(admin.get(f"/v2/organizations/{org}"), 404, "NOT_FOUND")
    err(admin.get(g_path), 404)


def test_protection_on_the_object_itself(admin: httpx.Client, org: str) -> None:
    o = ok(admin.get(f"/v2/organizations/{org}"))
    ok(admin.put(f"/v2/organizations/{org}", json={**o, "deletionProtectionEnabled": True}))
    body = err(admin.delete(f"/v2/organizations/{org}"), 400, "FAILED_PRECONDITION")
    assert f"organizations/{org} has deletionProtectionEnabled" in body["message"]
    o = ok(admin.get(f"/v2/organizations/{org}"))
    ok(admin.put(f"/v2/organizations/{org}", json={**o, "deletionProtectionEnabled": False}))
    ok(admin.delete(f"/v2/organizations/{org}"))
    err(admin.delete(f"/v2/organizations/{org}"), 404)


def test_a_put_that_leaves_protection_out_keeps_it_on(admin: httpx.Client, org: str) -> None:
    """Protection goes off only when a body says ``false``: a PUT built by a client
    that does not know the field (or from an older read) never silently unprotects."""
    path = f"/v2/organizations/{org}"
    o = ok(admin.get(path))
    ok(admin.put(path, json={**o, "deletionProtectionEnabled": True}))
    o = ok(admin.get(path))
    without = {k: v for k, v in o.items() if k != "deletionProtectionEnabled"}
    updated = ok(admin.put(path, json={**without, "description": "renamed"}))
    assert updated["deletionProtectionEnabled"] is True
    assert updated["description"] == "renamed"
    err(admin.delete(path), 400, "FAILED_PRECONDITION")
    ok(admin.put(path, json={**updated, "deletionProtectionEnabled": False}))
    ok(admin.delete(path))


def test_recursive_delete_of_a_large_tree(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    """5,000 objects seeded straight into the store, then one DELETE removes them all."""
    engine = create_engine(server.database_url)
    try:
        with write_tx(engine) as conn:
            now = repo.now_us()
            rows = []
            for t in range(50):
                tenant = f"organizations/{org}/tenants/t{t}"
                rows.append((tenant, f"organizations/{org}", "Tenant"))
                for w in range(99):
                    rows.append((f"{tenant}/workspaces/w{w}", tenant, "Workspace"))
            conn.execute(
                sa.insert(tables.resources),
                [
                    {
                        "fqn": f,
                        "parent": p,
                        "kind": k,
                        "name": f.rsplit("/", 1)[1],
                        "spec": json.dumps(SEEDED_SPECS[k]),
                        "status": "{}",
                        "etag": '"x"',
                        "protected": False,
                        "creator": "test",
                        "create_time": now,
                        "update_time": now,
                    }
                    for f, p, k in rows
                ],
            )
        page = ok(
            admin.get(f"/v2/organizations/{org}/tenants/t7/workspaces", params={"pageSize": 1000})
        )
        assert len(page["workspaces"]) == 99
        ok(admin.delete(f"/v2/organizations/{org}"))
        with engine.connect() as conn:
            left = conn.execute(
                sa.select(sa.func.count())
                .select_from(tables.resources)
                .where(tables.resources.c.fqn.like(f"organizations/{org}%"))
            ).scalar_one()
        assert left == 0
        # a sibling org with a prefix-sharing name is untouched
    finally:
        engine.dispose()


def test_delete_does_not_touch_prefix_siblings(admin: httpx.Client, org: str) -> None:
    ok(admin.post("/v2/organizations", json={"name": f"{org}-b", "organization": {}}))
    ok(admin.post(f"/v2/organizations/{org}-b/tenants", json={"name": "t", "tenant": {}}))
    ok(admin.delete(f"/v2/organizations/{org}"))
    ok(admin.get(f"/v2/organizations/{org}-b/tenants/t"))
    ok(admin.delete(f"/v2/organizations/{org}-b"))


def test_deleting_a_cluster_deletes_its_mesh_cas(
    server: MgmtServer, admin: httpx.Client, org: str
) -> None:
    base = f"/v2/organizations/{org}/clusters"
    fqn = f"organizations/{org}/clusters/mesh"
    ok(admin.post(base, json={"name": "mesh", "cluster": {}}))
    uow = UnitOfWork(create_engine(server.database_url))
    try:
        MeshCaStore(uow).get(org, "mesh")  # what a sidecar's first stream does (docs/mesh.md)
        with uow.read() as conn:
            res = repo.get(conn, fqn)
        assert res is not None
        prefix = mesh_ca.store_prefix(fqn, res.create_time)

        def stored() -> int:
            with uow.read() as conn:
                keys = [r[0] for r in conn.execute(sa.text("SELECT key FROM server_kv"))]
            return sum(1 for k in keys if k.startswith(prefix))

        assert stored() == 1
        ok(admin.delete(f"{base}/mesh"))
        assert stored() == 0
    finally:
        uow.engine.dispose()
