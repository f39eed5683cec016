"""The store-backed snapshot builder and the status view built on it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from extauthz.config import load_config
from meshplane.distribution_contract import NodeIdentity
from mgmt_api.distribution.hub import Distribution, DistributionTls
from mgmt_api.distribution.store_backend import StoreBackend
from mgmt_api.errors import ApiError
from mgmt_api.settings import Settings
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
    assert [p["name"] for p in az_a["policies"]] == ["t.w.g.p"]
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


def test_same_workspace_group_and_policy_names_in_two_tenants_do_not_collide(
    tmp_path: Path,
) -> None:
    """``t1/w/g/jwt`` and ``t2/w/g/jwt`` both reach cluster ``a``: the ext_authz
    loader refuses a file with a duplicate policy name, which would make every
    extauthz instance of the cluster NACK every snapshot from then on."""
    engine = _engine(tmp_path)
    for tenant, secret in (("t1", "first-tenant-secret"), ("t2", "second-tenant-secret")):
        _put(engine, f"{ORG}/tenants/{tenant}", "Tenant", {})
        _put(
            engine,
            f"{ORG}/tenants/{tenant}/workspaces/w",
            "Workspace",
            {"namespaceSelector": {"names": ["a/*"]}},
        )
        group = f"{ORG}/tenants/{tenant}/workspaces/w/securitygroups/g"
        _put(engine, group, "SecurityGroup", {})
        jwt = {"algorithms": ["HS256"], "keys": [{"hmacSecret": {"value": secret}}]}
        _put(engine, f"{group}/extauthzpolicies/jwt", "ExtAuthzPolicy", {"jwt": jwt})
    compiled = StoreBackend(engine).build_sync(NodeIdentity("extauthz", "o", "a", "i"))
    doc = yaml.safe_load(compiled.files["extauthz.yaml"])
    assert [p["name"] for p in doc["policies"]] == ["t1.w.g.jwt", "t2.w.g.jwt"]
    path = tmp_path / "extauthz.yaml"
    path.write_bytes(compiled.files["extauthz.yaml"])
    config = load_config(path)  # the services' own loader accepts it
    assert set(config.policies) == {"t1.w.g.jwt", "t2.w.g.jwt"}


def test_cluster_switches_carry_spec_host_port_as_a_redis_url(tmp_path: Path) -> None:
    """Spec §2.9 writes ``backend.redis.url`` as ``<host>:<port>``; it is stored as
    written and the ratelimit instances get the URL it means."""
    engine = _engine(tmp_path)
    _put(engine, ORG, "Organization", {})
    rate_limit = {"backend": {"type": "Redis", "redis": {"url": "redis.infra:6380"}}}
    _put(engine, f"{ORG}/clusters/a", "Cluster", {"rateLimit": rate_limit})
    compiled = StoreBackend(engine).build_sync(NodeIdentity("ratelimit", "o", "a", "i"))
    switches = json.loads(compiled.files["cluster-switches.json"])
    assert switches["rateLimit"]["backend"]["redis"]["url"] == "redis://redis.infra:6380"


def test_settings_choose_the_stale_threshold_and_tls(tmp_path: Path) -> None:
    """``MESHPLANE_DISTRIBUTION_STALE_AFTER`` and the ``MESHPLANE_GRPC_TLS_*`` files."""
    engine = _engine(tmp_path)
    base = Settings(database_url="sqlite://", grpc_listen="127.0.0.1:0")
    assert Distribution.from_settings(engine, replace(base, grpc_listen=None)) is None
    default = Distribution.from_settings(engine, base)
    assert default is not None and default.registry.stale_after == 60 and default.tls is None
    tuned = Distribution.from_settings(engine, replace(base, distribution_stale_after="2m"))
    assert tuned is not None and tuned.registry.stale_after == 120
    tls = Distribution.from_settings(
        engine, replace(base, grpc_tls_cert="c.pem", grpc_tls_key="k.pem", grpc_tls_client_ca="ca")
    )
    assert tls is not None and tls.tls == DistributionTls("c.pem", "k.pem", "ca")
    with pytest.raises(ValueError, match="both"):
        Distribution.from_settings(engine, replace(base, grpc_tls_cert="c.pem"))
    with pytest.raises(ApiError):
        Distribution.from_settings(engine, replace(base, distribution_stale_after="soon"))
