"""The store-backed snapshot builder and the status view built on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from meshplane.distribution_client import NodeIdentity
from mgmt_api.distribution.hub import Distribution
from mgmt_api.distribution.store_backend import StoreBackend
from mgmt_api.store import repo
from mgmt_api.store.engine import create_engine, migrate, write_tx

ORG = "organizations/o"


def _put(engine: Any, fqn: str, kind: str, spec: dict[str, Any]) -> None:
    parent, _, name = fqn.rpartition("/")
    parent = parent.rpartition("/")[0]
    with write_tx(engine) as conn:
        repo.insert(
            conn,
            repo.Resource(
                fqn=fqn,
                parent=parent,
                kind=kind,
                name=name,
                spec=spec,
                status={},
                etag="e",
                protected=False,
                creator="test",
                create_time=repo.now_us(),
                update_time=repo.now_us(),
            ),
        )


def _engine(tmp_path: Path) -> Any:
    engine = create_engine(f"sqlite+pysqlite:///{tmp_path / 'db.sqlite'}")
    migrate(engine)
    return engine


RULES = {"global": {"rules": [{"limit": {"requests": 3, "unit": "Minute"}}]}}


def test_snapshots_hold_only_the_nodes_cluster(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    for cluster in ("a", "b"):
        _put(
            engine,
            f"{ORG}/clusters/{cluster}/backendtrafficpolicies/default.{cluster}-limit",
            "BackendTrafficPolicy",
            {
                "metadata": {"name": f"{cluster}-limit", "namespace": "default"},
                "spec": {"targetRef": {"name": "web"}, "rateLimit": RULES},
            },
        )
    _put(engine, f"{ORG}/tenants/t", "Tenant", {})
    _put(
        engine,
        f"{ORG}/tenants/t/workspaces/w",
        "Workspace",
        {"namespaceSelector": {"names": ["a/*"]}},
    )
    group = f"{ORG}/tenants/t/workspaces/w/securitygroups/g"
    _put(engine, group, "SecurityGroup", {})
    jwt = {"algorithms": ["HS256"], "keys": [{"hmacSecret": {"value": "s3cret-s3cret"}}]}
    _put(engine, f"{group}/extauthzpolicies/p", "ExtAuthzPolicy", {"jwt": jwt})
    backend = StoreBackend(engine)
    rl_a = backend.build_sync(NodeIdentity("ratelimit", "o", "a", "i"))
    assert [yaml.safe_load(c)["domain"] for c in rl_a.files.values()] == ["a/default/a-limit"]
    az_a = yaml.safe_load(
        backend.build_sync(NodeIdentity("extauthz", "o", "a", "i")).files["extauthz.yaml"]
    )
    assert az_a["defaultPolicy"] == "deny"
    assert [p["name"] for p in az_a["policies"]] == ["w.g.p"]
    az_b = yaml.safe_load(
        backend.build_sync(NodeIdentity("extauthz", "o", "b", "i")).files["extauthz.yaml"]
    )
    assert az_b["policies"] == []  # the workspace selects cluster a only


def test_an_uncompilable_stored_policy_shows_in_the_status(tmp_path: Path) -> None:
    engine = _engine(tmp_path)
    _put(
        engine,
        f"{ORG}/clusters/a/backendtrafficpolicies/default.bad",
        "BackendTrafficPolicy",
        {
            "metadata": {"name": "bad"},
            "spec": {"targetRef": {"name": "web"}, "rateLimit": {"type": "Local"}},
        },
    )
    status = Distribution(engine, "127.0.0.1:0").cluster_status("o", "a")
    assert status["desiredVersions"]["ratelimit"] == ""
    assert "ratelimit" in status["compileErrors"]
    assert status["desiredVersions"]["extauthz"]
