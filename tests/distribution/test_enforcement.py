"""The read model (what a cluster must enforce), the snapshots compiled from it,
and the status view built on them.

Objects are written straight into the store (bypassing the API's validation)
so the tests can also hold what the API would refuse: a stored policy the
compiler rejects must show as a compile error, never reach a subscriber.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from extauthz import contract as extauthz_contract
from meshplane.config_error import ConfigError
from meshplane.tls import ListenerTlsFiles
from mgmt_api.distribution.hub import tls_from
from mgmt_api.errors import ApiError
from mgmt_api.service.container import Services
from mgmt_api.service.enforcement import EnforcementService, UnknownCluster
from mgmt_api.service.instances import SubscriberRegistry
from mgmt_api.service.status import StatusService
from mgmt_api.settings import Settings
from mgmt_api.store import repo
from mgmt_api.store.engine import create_engine, migrate, write_tx
from mgmt_api.store.uow import UnitOfWork
from ratelimit import contract as ratelimit_contract

ORG = "organizations/o"
RULES = {"global": {"rules": [{"limit": {"requests": 3, "unit": "Minute"}}]}}


def _put(engine: Any, fqn: str, kind: str, spec: dict[str, Any]) -> None:
    parent, _, name = fqn.rpartition("/")
    parent = parent.rpartition("/")[0]
    with write_tx(engine) as conn:
        repo.insert(
            conn,
            repo.new_resource(
                fqn, kind, spec, revision=1, creator="test", parent=parent, name=name
            ),
        )


@pytest.fixture
def engine(tmp_path: Path) -> Any:
    engine = create_engine(f"sqlite+pysqlite:///{tmp_path / 'db.sqlite'}")
    migrate(engine)
    _put(engine, ORG, "Organization", {})
    for cluster in ("a", "b"):
        _put(engine, f"{ORG}/clusters/{cluster}", "Cluster", {})
    return engine


def _jwt(secret: str) -> dict[str, Any]:
    return {"algorithms": ["HS256"], "keys": [{"hmacSecret": {"value": secret}}]}


def _group(engine: Any, tenant: str, selector: list[str]) -> str:
    _put(engine, f"{ORG}/tenants/{tenant}", "Tenant", {})
    _put(
        engine,
        f"{ORG}/tenants/{tenant}/workspaces/w",
        "Workspace",
        {"namespaceSelector": {"names": selector}},
    )
    group = f"{ORG}/tenants/{tenant}/workspaces/w/securitygroups/g"
    _put(engine, group, "SecurityGroup", {})
    return group


def test_snapshots_hold_only_the_clusters_own_policies(engine: Any) -> None:
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
    group = _group(engine, "t", ["a/*"])
    _put(engine, f"{group}/extauthzpolicies/p", "ExtAuthzPolicy", {"jwt": _jwt("s3cret" * 6)})
    service = EnforcementService(UnitOfWork(engine))
    rl_a = service.snapshot("ratelimit", "o", "a")
    assert [yaml.safe_load(c)["domain"] for c in rl_a.files.values()] == ["a/default/a-limit"]
    az_a = yaml.safe_load(service.snapshot("extauthz", "o", "a").files["extauthz.yaml"])
    assert az_a["defaultPolicy"] == "deny"
    assert [p["name"] for p in az_a["policies"]] == ["t.w.g.p"]
    az_b = yaml.safe_load(service.snapshot("extauthz", "o", "b").files["extauthz.yaml"])
    assert az_b["policies"] == []  # the workspace selects cluster a only


def test_every_snapshot_loads_with_the_services_own_loaders(engine: Any) -> None:
    """What the management plane publishes is what ``ratelimit``/``extauthz serve``
    accept from a directory: both contracts parse both snapshots."""
    _put(
        engine,
        f"{ORG}/clusters/a/backendtrafficpolicies/default.limit",
        "BackendTrafficPolicy",
        {"metadata": {"name": "limit"}, "spec": {"targetRef": {"name": "web"}, "rateLimit": RULES}},
    )
    service = EnforcementService(UnitOfWork(engine))
    config, switches = ratelimit_contract.parse_config(
        service.snapshot("ratelimit", "o", "a").files
    )
    assert list(config.domains) == ["a/default/limit"] and switches is None
    content = service.snapshot("extauthz", "o", "a").files[extauthz_contract.FILE_NAME]
    assert extauthz_contract.parse_config(content).default_policy == "deny"


def test_a_deleted_cluster_has_no_snapshot(engine: Any) -> None:
    """Never an empty snapshot (no limits, no policies) for a cluster that is gone."""
    with pytest.raises(UnknownCluster):
        EnforcementService(UnitOfWork(engine)).snapshot("ratelimit", "o", "gone")


def test_an_uncompilable_stored_policy_shows_in_the_status(engine: Any) -> None:
    _put(
        engine,
        f"{ORG}/clusters/a/backendtrafficpolicies/default.bad",
        "BackendTrafficPolicy",
        {
            "metadata": {"name": "bad"},
            "spec": {"targetRef": {"name": "web"}, "rateLimit": {"type": "Local"}},
        },
    )
    uow = UnitOfWork(engine)
    status = StatusService(uow, EnforcementService(uow), SubscriberRegistry())
    view = status._cluster_view(SubscriberRegistry(), "o", "a")
    assert view["desiredVersions"]["ratelimit"] == ""
    assert "ratelimit" in view["compileErrors"]
    assert view["desiredVersions"]["extauthz"]


def test_a_snapshot_the_service_would_refuse_is_never_built(engine: Any) -> None:
    """A stored switch the ratelimit loader refuses fails the build (status shows
    it) instead of being sent to every instance to NACK."""
    with write_tx(engine) as conn:
        cluster = repo.get(conn, f"{ORG}/clusters/a")
        assert cluster is not None
        repo.update_if_etag(
            conn,
            cluster.fqn,
            cluster.etag,
            spec={"rateLimit": {"failureMode": "sometimes"}},
            protected=False,
            etag="e2",
            update_time=repo.now_us(),
        )
    with pytest.raises(ConfigError, match="must be one of"):
        EnforcementService(UnitOfWork(engine)).snapshot("ratelimit", "o", "a")


def test_same_workspace_group_and_policy_names_in_two_tenants_do_not_collide(
    engine: Any,
) -> None:
    """``t1/w/g/jwt`` and ``t2/w/g/jwt`` both reach cluster ``a``: the ext_authz
    loader refuses a file with a duplicate policy name, which would make every
    extauthz instance of the cluster NACK every snapshot from then on."""
    for tenant, secret in (("t1", "first-tenant-secret" * 2), ("t2", "second-tenant-secret" * 2)):
        group = _group(engine, tenant, ["a/*"])
        _put(engine, f"{group}/extauthzpolicies/jwt", "ExtAuthzPolicy", {"jwt": _jwt(secret)})
    snapshot = EnforcementService(UnitOfWork(engine)).snapshot("extauthz", "o", "a")
    doc = yaml.safe_load(snapshot.files["extauthz.yaml"])
    assert [p["name"] for p in doc["policies"]] == ["t1.w.g.jwt", "t2.w.g.jwt"]
    config = extauthz_contract.parse_config(snapshot.files["extauthz.yaml"])
    assert set(config.policies) == {"t1.w.g.jwt", "t2.w.g.jwt"}


def test_cluster_switches_travel_as_stored(engine: Any) -> None:
    """The URL is normalised when written (the API stores ``redis://host:port`` for
    the reference's ``host:port``), so the snapshot carries what is stored."""
    rate_limit = {"backend": {"type": "Redis", "redis": {"url": "redis://redis.infra:6380"}}}
    _put(engine, f"{ORG}/clusters/c", "Cluster", {"rateLimit": rate_limit})
    snapshot = EnforcementService(UnitOfWork(engine)).snapshot("ratelimit", "o", "c")
    switches = json.loads(snapshot.files["cluster-switches.json"])
    assert switches["rateLimit"]["backend"]["redis"]["url"] == "redis://redis.infra:6380"


def test_settings_choose_the_stale_threshold_and_tls(tmp_path: Path) -> None:
    """``MESHPLANE_DISTRIBUTION_STALE_AFTER`` and the ``MESHPLANE_GRPC_TLS_*`` files."""
    url = f"sqlite+pysqlite:///{tmp_path / 'db.sqlite'}"
    engine = create_engine(url)
    migrate(engine)
    base = Settings(database_url=url, grpc_listen="127.0.0.1:0", admin_password="x" * 12)
    assert Services.build(engine, replace(base, grpc_listen=None)).registry is None
    default = Services.build(engine, base).registry
    assert default is not None and default.stale_after == 60
    tuned = Services.build(engine, replace(base, distribution_stale_after="2m")).registry
    assert tuned is not None and tuned.stale_after == 120
    assert tls_from(base) is None
    both = replace(base, grpc_tls_cert="c.pem", grpc_tls_key="k.pem", grpc_tls_client_ca="ca")
    assert tls_from(both) == ListenerTlsFiles("c.pem", "k.pem", "ca")
    with pytest.raises(ValueError, match="both"):
        tls_from(replace(base, grpc_tls_cert="c.pem"))
    with pytest.raises(ApiError):
        Services.build(engine, replace(base, distribution_stale_after="soon"))
