"""Process settings: command-line flags over environment variables over defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from mgmt_api.store.engine import default_sqlite_url

DEFAULT_LISTEN = "127.0.0.1:8443"
DEFAULT_GRPC_LISTEN = "127.0.0.1:8444"
MAX_BODY_BYTES = 1024 * 1024


def data_dir() -> str:
    return os.environ.get("MESHPLANE_DATA_DIR") or os.path.join(os.getcwd(), ".data")


@dataclass(frozen=True)
class Settings:
    database_url: str = field(
        default_factory=lambda: (
            os.environ.get("MESHPLANE_DATABASE_URL") or default_sqlite_url(data_dir())
        )
    )
    admin_password: str | None = field(
        default_factory=lambda: os.environ.get("MESHPLANE_ADMIN_PASSWORD") or None
    )
    # Address agents are told to use in install templates; default: the URL
    # the request came in on.
    public_url: str | None = field(
        default_factory=lambda: os.environ.get("MESHPLANE_PUBLIC_URL") or None
    )
    max_body_bytes: int = MAX_BODY_BYTES
    # PolicyDistribution gRPC address (HOST:PORT; port 0 picks one); None
    # serves no distribution (REST only, as in tests of the API alone).
    grpc_listen: str | None = field(
        default_factory=lambda: (
            None
            if os.environ.get("MESHPLANE_GRPC_LISTEN", "off") in ("", "off")
            else os.environ["MESHPLANE_GRPC_LISTEN"]
        )
    )
    # The URL gateways and subscribers are told to reach the gRPC port at
    # (grpc://HOST:PORT or grpcs://HOST:PORT): the ADS address of the install
    # template's gateway bootstrap. Default: the host of the public URL with
    # the port of grpc_listen (grpcs when that port serves TLS).
    grpc_public_url: str | None = field(
        default_factory=lambda: os.environ.get("MESHPLANE_GRPC_PUBLIC_URL") or None
    )
    # TLS of the PolicyDistribution stream (PEM files; docs/policy-publishing.md).
    # Snapshots carry inline JWT secrets: without a certificate the stream is
    # plaintext, which the server only accepts quietly on loopback. With a
    # client CA, subscribers also need a certificate chaining to it (mTLS).
    grpc_tls_cert: str | None = field(
        default_factory=lambda: os.environ.get("MESHPLANE_GRPC_TLS_CERT") or None
    )
    grpc_tls_key: str | None = field(
        default_factory=lambda: os.environ.get("MESHPLANE_GRPC_TLS_KEY") or None
    )
    grpc_tls_client_ca: str | None = field(
        default_factory=lambda: os.environ.get("MESHPLANE_GRPC_TLS_CLIENT_CA") or None
    )
    # How often the policy streams re-read the stored revision, to see writes of
    # other replicas (a duration). Empty: 1 s on SQLite (the only way to see
    # them), 30 s on PostgreSQL, where each commit's NOTIFY wakes every replica
    # at once and the poll only backs up a listener that lost its connection.
    revision_poll: str | None = field(
        default_factory=lambda: os.environ.get("MESHPLANE_REVISION_POLL") or None
    )
    # HTTPS of the REST port (and the console at /ui/; docs/api.md "HTTPS"):
    # PEM files, reloaded when they change. With a client CA, every client
    # must also present a certificate chaining to it (mTLS). Without a
    # certificate the port speaks plain HTTP, which is only quiet on loopback.
    tls_cert: str | None = field(
        default_factory=lambda: os.environ.get("MESHPLANE_TLS_CERT") or None
    )
    tls_key: str | None = field(default_factory=lambda: os.environ.get("MESHPLANE_TLS_KEY") or None)
    tls_client_ca: str | None = field(
        default_factory=lambda: os.environ.get("MESHPLANE_TLS_CLIENT_CA") or None
    )
    # A subscribed ratelimit/extauthz instance not heard from for longer than
    # this (a duration, "60s", "2m") shows ``stale: true`` in the status views.
    distribution_stale_after: str = field(
        default_factory=lambda: os.environ.get("MESHPLANE_DISTRIBUTION_STALE_AFTER") or "60s"
    )
    # The install config (YAML) with ``spec.identityProvider`` (OIDC login and
    # directory sync, docs/identity.md); None: both are off.
    install_config: str | None = field(
        default_factory=lambda: os.environ.get("MESHPLANE_CONFIG") or None
    )
    # Cluster onboarding (docs/api.md, "Cluster onboarding"): the tenant and
    # workspace onboarded namespaces join, created when missing.
    onboarding_tenant: str = field(
        default_factory=lambda: os.environ.get("MESHPLANE_ONBOARDING_TENANT") or "onboarding"
    )
    onboarding_workspace: str = field(
        default_factory=lambda: os.environ.get("MESHPLANE_ONBOARDING_WORKSPACE") or "onboarding"
    )
    # A cluster whose agent has not reported for longer than this (a duration,
    # "300s", "5m") shows ``state.stale: true``.
    agent_stale_after: str = field(
        default_factory=lambda: os.environ.get("MESHPLANE_AGENT_STALE_AFTER") or "300s"
    )
    # Lifetime of a sidecar's workload certificate (a duration, "24h"; 1m-30d):
    # it is rotated at half-life on the open ADS stream (docs/mesh.md).
    sidecar_certificate_ttl: str = field(
        default_factory=lambda: os.environ.get("MESHPLANE_SIDECAR_CERT_TTL") or "24h"
    )
    # A mesh CA rotation phase's wait after the last certificate it waits for (a
    # duration, "10s"; 1s-5m): time for the sidecars to apply the pushed bundle.
    mesh_ca_settle: str = field(
        default_factory=lambda: os.environ.get("MESHPLANE_MESH_CA_SETTLE") or "10s"
    )
    # Proxy diagnostics (docs/agent.md): how long the agent may take for one
    # proxy (a duration, "10s"); mgmt-api answers 504 a little after that.
    proxytools_timeout: str = field(
        default_factory=lambda: os.environ.get("MESHPLANE_PROXYTOOLS_TIMEOUT") or "10s"
    )
    # /metrics is served without credentials only when this is true (for a
    # scrape on a private network); otherwise it needs any valid credential.
    public_metrics: bool = field(
        default_factory=lambda: os.environ.get("MESHPLANE_PUBLIC_METRICS", "") == "1"
    )
    # Addresses and CIDRs of the proxies in front of the REST port whose
    # X-Forwarded-For / Forwarded headers say who the client is (comma- or
    # space-separated; mgmt_api.domain.client_address). Empty: none, the
    # socket's peer is the client.
    trusted_proxies: str = field(
        default_factory=lambda: os.environ.get("MESHPLANE_TRUSTED_PROXIES") or ""
    )
    # The header those proxies append the client to: x-forwarded-for or forwarded
    # (RFC 7239). Only that one is read.
    forwarded_header: str = field(
        default_factory=lambda: os.environ.get("MESHPLANE_FORWARDED_HEADER") or "x-forwarded-for"
    )
    # The first lock-out of an address after its free failed logins (a
    # duration); each further failure doubles it, up to 300 s or this if longer
    # (mgmt_api.domain.throttle).
    login_lockout: str = field(
        default_factory=lambda: os.environ.get("MESHPLANE_LOGIN_LOCKOUT") or "1s"
    )
    # Several replicas on one PostgreSQL (docs/mgmt-api-architecture.md): the
    # secret every replica shares to sign a proxytools call forwarded to the
    # replica that holds the cluster's agent tunnel. Unset: nothing is
    # forwarded (one replica).
    replica_secret: str | None = field(
        default_factory=lambda: os.environ.get("MESHPLANE_REPLICA_SECRET") or None
    )
    # The URL other replicas reach this one's REST port at (e.g. the pod IP).
    # Default: derived from --listen (the host name when it listens on all).
    replica_address: str | None = field(
        default_factory=lambda: os.environ.get("MESHPLANE_REPLICA_ADDRESS") or None
    )
    # The CA that signs the other replicas' REST certificates, for the forwarding
    # hop over HTTPS: peers are reached by address (a pod IP), which their
    # certificate need not name, so the chain is checked against this CA and the
    # host name is not (the hop itself is signed with the replica secret).
    # Unset: the system's CAs and the host name, as for any HTTPS client.
    replica_ca: str | None = field(
        default_factory=lambda: os.environ.get("MESHPLANE_REPLICA_CA") or None
    )
    # How often the expired-login purge runs (once per period across replicas).
    purge_interval: str = field(
        default_factory=lambda: os.environ.get("MESHPLANE_PURGE_INTERVAL") or "600s"
    )
